//! Store URLs as they may appear in messages and logs: with the password replaced. One rule for
//! every backend: the password is everything between the first `:` of the user part and the last
//! `@` of the authority, so a password holding `@` or `:` is hidden whole, and a URL with an
//! empty host (`postgres://app:pw@/db?host=/run/pg`) is redacted too.

/// `url` with its password replaced by `***`; a URL without one is returned as it is.
pub fn redact_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_owned();
    };
    let password = rest_start + colon + 1..rest_start + at;
    format!("{}***{}", &url[..password.start], &url[password.end..])
}

#[cfg(test)]
mod tests {
    use super::redact_password;

    #[test]
    fn passwords_are_redacted_whole_on_every_backend_url() {
        let cases = [
            ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
            ("rediss://app:p@ss@cache", "rediss://app:***@cache"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://app@cache", "redis://app@cache"),
            (
                "postgres://app:p@ss@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            (
                "postgres://app:s3cret@/x?host=/run/pg",
                "postgres://app:***@/x?host=/run/pg",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/test",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            ("not a url", "not a url"),
        ];
        for (url, redacted) in cases {
            assert_eq!(redact_password(url), redacted, "{url}");
        }
    }
}
