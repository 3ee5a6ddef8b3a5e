//! TLS to PostgreSQL: `[store.tls]` applied to the connection options, or the URL's own `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` checked (the files exist, parse, and the key matches),
//! never both. sqlx makes the connection with rustls and ring.

use std::path::Path;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::config::{PostgresStoreConfig, StoreTlsMode};
use crate::tls::{read_ca, read_client_identity, StoreTls, StoreTlsError};

/// The URL's query parameters that name TLS settings, as sqlx reads them.
const URL_TLS_PARAMETERS: [&str; 9] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
];

/// `options` with the store's TLS settings; `Err` names the setting that cannot be used.
pub fn with_tls(
    options: PgConnectOptions,
    config: &PostgresStoreConfig,
) -> Result<PgConnectOptions, StoreTlsError> {
    let parameters = url_parameters(&config.url);
    let in_url = parameters
        .iter()
        .any(|(name, _)| URL_TLS_PARAMETERS.contains(&name.as_str()));
    let Some(table) = &config.tls else {
        check_url_files(&parameters)?;
        return Ok(options);
    };
    if in_url {
        return Err(StoreTlsError::new(
            "tls",
            "TLS is set both in the URL (sslmode, sslrootcert, sslcert or sslkey) and in [store.tls]: give it in one place",
        ));
    }
    let tls = StoreTls::load(table)?;
    let mut options = options.ssl_mode(match tls.mode {
        StoreTlsMode::Require => PgSslMode::Require,
        StoreTlsMode::VerifyCa => PgSslMode::VerifyCa,
        StoreTlsMode::VerifyFull => PgSslMode::VerifyFull,
    });
    if let Some(ca) = tls.ca_pem {
        options = options.ssl_root_cert_from_pem(ca);
    }
    if let Some(client) = tls.client {
        options = options
            .ssl_client_cert_from_pem(client.cert_pem)
            .ssl_client_key_from_pem(client.key_pem);
    }
    Ok(options)
}

/// Whether the settings encrypt without verifying the server (`require`): worth a warning.
pub fn encrypts_without_verifying(options: &PgConnectOptions) -> bool {
    matches!(options.get_ssl_mode(), PgSslMode::Require)
}

/// The URL's query as name/value pairs (none when it does not parse: sqlx reports that).
fn url_parameters(url: &str) -> Vec<(String, String)> {
    url::Url::parse(url)
        .map(|url| {
            url.query_pairs()
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The files the URL names, read and checked as `[store.tls]`'s would be.
fn check_url_files(parameters: &[(String, String)]) -> Result<(), StoreTlsError> {
    let named = |names: &[&str]| {
        parameters
            .iter()
            .find(|(name, _)| names.contains(&name.as_str()))
            .map(|(_, value)| Path::new(value.as_str()))
    };
    if let Some(ca) = named(&["sslrootcert", "ssl-root-cert", "ssl-ca"]) {
        read_ca(ca, "url")?;
    }
    read_client_identity(
        named(&["sslcert", "ssl-cert"]),
        named(&["sslkey", "ssl-key"]),
        ("url", "url"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str, tls: Option<crate::config::StoreTlsConfig>) -> PostgresStoreConfig {
        let text = format!("url = {url:?}\n");
        let mut config: PostgresStoreConfig = toml::from_str(&text).expect("config");
        config.tls = tls;
        config
    }

    fn apply(config: &PostgresStoreConfig) -> Result<PgConnectOptions, StoreTlsError> {
        with_tls(config.url.parse().expect("url"), config)
    }

    #[test]
    fn a_url_without_tls_settings_is_left_as_it_is() {
        let options = apply(&config("postgres://u@db/test", None)).expect("options");
        assert!(matches!(options.get_ssl_mode(), PgSslMode::Prefer));
    }

    #[test]
    fn the_table_sets_verify_full_by_default() {
        let tls = crate::config::StoreTlsConfig::default();
        let options = apply(&config("postgres://u@db/test", Some(tls))).expect("options");
        assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyFull));
        assert!(!encrypts_without_verifying(&options));
    }

    #[test]
    fn require_is_reported_as_unverified() {
        let tls = crate::config::StoreTlsConfig {
            mode: Some(StoreTlsMode::Require),
            ..Default::default()
        };
        let options = apply(&config("postgres://u@db/test", Some(tls))).expect("options");
        assert!(encrypts_without_verifying(&options));
    }

    #[test]
    fn tls_in_the_url_and_in_the_table_is_refused() {
        let tls = crate::config::StoreTlsConfig::default();
        let error = apply(&config("postgres://u@db/test?sslmode=require", Some(tls)))
            .expect_err("both places");
        assert_eq!(error.field, "tls");
    }

    #[test]
    fn a_missing_root_certificate_in_the_url_names_the_file() {
        let error = apply(&config(
            "postgres://u@db/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            None,
        ))
        .expect_err("missing file");
        assert_eq!(error.field, "url");
        assert!(error.message.contains("/nonexistent/ca.pem"), "{error}");
    }

    #[test]
    fn a_client_certificate_without_its_key_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("client.pem");
        std::fs::write(&cert, "not used").expect("write");
        let tls = crate::config::StoreTlsConfig {
            client_cert: Some(cert),
            ..Default::default()
        };
        let error = apply(&config("postgres://u@db/test", Some(tls))).expect_err("no key");
        assert_eq!(error.field, "tls.client_key");
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "hello").expect("write");
        let tls = crate::config::StoreTlsConfig {
            ca_file: Some(ca),
            ..Default::default()
        };
        let error = apply(&config("postgres://u@db/test", Some(tls))).expect_err("not pem");
        assert_eq!(error.field, "tls.ca_file");
        assert!(error.message.contains("ca.pem"), "{error}");
    }
}
