//! The Redis client for a store's URL: `rediss://` with `[store.tls]`'s CAs and client
//! certificate (rustls and ring, through the redis crate), the bundled web roots without the
//! table. Verification cannot be turned off: a URL's `#insecure` is refused.

use crate::config::RedisStoreConfig;
use crate::tls::{StoreTls, StoreTlsError};

/// The client for `config`'s server; `Err` names the setting that cannot be used.
pub fn client(config: &RedisStoreConfig) -> Result<redis::Client, StoreTlsError> {
    let url = config.url.as_str();
    let tls_url = url.starts_with("rediss://");
    if tls_url && url.contains('#') && url.rsplit('#').next() == Some("insecure") {
        return Err(StoreTlsError::new(
            "url",
            "#insecure turns certificate verification off; give the server's CA in [store.tls] ca_file instead",
        ));
    }
    let invalid = |e: redis::RedisError| StoreTlsError::new("url", format!("invalid url: {e}"));
    let Some(table) = &config.tls else {
        return redis::Client::open(url).map_err(invalid);
    };
    if !tls_url {
        return Err(StoreTlsError::new(
            "tls",
            "[store.tls] needs a rediss:// URL (redis:// is plain TCP)",
        ));
    }
    if table.mode.is_some() {
        return Err(StoreTlsError::new(
            "tls.mode",
            "PostgreSQL only: Redis over TLS always verifies the server's certificate and name",
        ));
    }
    let tls = StoreTls::load(table)?;
    let certificates = redis::TlsCertificates {
        client_tls: tls.client.map(|client| redis::ClientTlsConfig {
            client_cert: client.cert_pem,
            client_key: client.key_pem,
        }),
        root_cert: tls.ca_pem,
    };
    redis::Client::build_with_tls(url, certificates).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{StoreTlsConfig, StoreTlsMode};

    fn config(url: &str, tls: Option<StoreTlsConfig>) -> RedisStoreConfig {
        let mut config: RedisStoreConfig =
            toml::from_str(&format!("url = {url:?}\n")).expect("config");
        config.tls = tls;
        config
    }

    #[test]
    fn plain_and_tls_urls_without_the_table_open() {
        assert!(client(&config("redis://127.0.0.1:6379", None)).is_ok());
        assert!(client(&config("rediss://127.0.0.1:6380", None)).is_ok());
    }

    #[test]
    fn insecure_is_refused() {
        let error =
            client(&config("rediss://127.0.0.1:6380/#insecure", None)).expect_err("insecure");
        assert_eq!(error.field, "url");
    }

    #[test]
    fn the_table_needs_a_tls_url_and_takes_no_mode() {
        let error = client(&config(
            "redis://127.0.0.1:6379",
            Some(StoreTlsConfig::default()),
        ))
        .expect_err("plain url");
        assert_eq!(error.field, "tls");
        let with_mode = StoreTlsConfig {
            mode: Some(StoreTlsMode::VerifyCa),
            ..Default::default()
        };
        let error = client(&config("rediss://127.0.0.1:6380", Some(with_mode))).expect_err("mode");
        assert_eq!(error.field, "tls.mode");
    }

    #[test]
    fn a_missing_ca_file_names_the_file() {
        let tls = StoreTlsConfig {
            ca_file: Some("/nonexistent/redis-ca.pem".into()),
            ..Default::default()
        };
        let error = client(&config("rediss://127.0.0.1:6380", Some(tls))).expect_err("missing");
        assert_eq!(error.field, "tls.ca_file");
        assert!(
            error.message.contains("/nonexistent/redis-ca.pem"),
            "{error}"
        );
    }
}
