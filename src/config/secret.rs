//! Where the configuration's secrets come from: an environment variable (`*_env`) or a file
//! (`*_file`, for mounted secrets), read when the setting is compiled — at start, and again on
//! every reload for what a reload recompiles. Errors name the variable or file, never a value.

use std::path::{Path, PathBuf};

/// Why a secret could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("give {field}_env or {field}_file, not both")]
    Both { field: String },
    #[error("the environment variable {name} is not set")]
    Unset { name: String },
    #[error("the environment variable {name} is empty")]
    EmptyVariable { name: String },
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is empty", path.display())]
    EmptyFile { path: PathBuf },
    #[error("{} is not UTF-8 text", path.display())]
    NotText { path: PathBuf },
}

/// The secret `field` names, from the variable `env` or the file `file` (one trailing line end
/// removed); `None` when neither is given.
pub fn read(
    field: &str,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, SecretError> {
    match (env, file) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(SecretError::Both {
            field: field.to_owned(),
        }),
        (Some(name), None) => from_env(name).map(Some),
        (None, Some(path)) => from_file(path).map(Some),
    }
}

/// Like [`read`], where an empty variable is a value (an etcd user without a password).
pub fn read_allowing_empty(
    field: &str,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, SecretError> {
    match (env, file) {
        (Some(name), None) => std::env::var(name)
            .map(Some)
            .map_err(|_| SecretError::Unset {
                name: name.to_owned(),
            }),
        _ => read(field, env, file),
    }
}

/// The value of the environment variable `name`, which must be set and not empty.
pub fn from_env(name: &str) -> Result<String, SecretError> {
    match std::env::var(name) {
        Ok(value) if value.is_empty() => Err(SecretError::EmptyVariable {
            name: name.to_owned(),
        }),
        Ok(value) => Ok(value),
        Err(_) => Err(SecretError::Unset {
            name: name.to_owned(),
        }),
    }
}

/// The text of the file at `path` without its last line end (files written by `echo` and most
/// secret mounts end with one), which must not be empty.
pub fn from_file(path: &Path) -> Result<String, SecretError> {
    let bytes = std::fs::read(path).map_err(|source| SecretError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let mut text = String::from_utf8(bytes).map_err(|_| SecretError::NotText {
        path: path.to_owned(),
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(SecretError::EmptyFile {
            path: path.to_owned(),
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_loses_one_line_end_and_must_hold_something() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        for (written, read) in [
            ("s3cret\n", "s3cret"),
            ("s3cret\r\n", "s3cret"),
            ("s3cret", "s3cret"),
            ("two\nlines\n", "two\nlines"),
            (" spaced \n\n", " spaced \n"),
        ] {
            std::fs::write(&path, written).unwrap();
            assert_eq!(from_file(&path).unwrap(), read, "{written:?}");
        }
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            from_file(&path),
            Err(SecretError::EmptyFile { .. })
        ));
        assert!(matches!(
            from_file(&dir.path().join("absent")),
            Err(SecretError::Unreadable { .. })
        ));
        assert!(matches!(
            read("client_secret", Some("X"), Some(&path)),
            Err(SecretError::Both { .. })
        ));
        assert_eq!(read("client_secret", None, None).unwrap(), None);
    }

    #[test]
    fn errors_name_the_source_never_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let message = from_file(&path).unwrap_err().to_string();
        assert!(
            message.contains("secret") && message.contains("UTF-8"),
            "{message}"
        );
        let message = from_env("FENCEGATE_TEST_SURELY_UNSET_VARIABLE")
            .unwrap_err()
            .to_string();
        assert!(message.contains("FENCEGATE_TEST_SURELY_UNSET_VARIABLE"));
    }
}
