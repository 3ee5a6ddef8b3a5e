//! A configuration compiled once: the plain data `config` reads and checks, the route table
//! compiled from it, the listeners' TLS settings read from their files, and the store's TLS files
//! checked. `check-config`, `serve`, the one-shot commands and every reload go through here, so
//! what `check-config` accepts is exactly what `serve` runs.

use std::path::Path;
use std::sync::Arc;

use crate::config::{load_file, parse_str, Config, ConfigError};
use crate::route::RouteTable;
use crate::tls::{ListenerTls, ListenerTlsError};

/// A configuration whose routes and TLS settings compiled.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub config: Config,
    pub routes: RouteTable,
    pub listeners: ListenerSettings,
}

/// The TLS settings of the data-plane and admin listeners (none: plain HTTP).
#[derive(Debug, Clone, Default)]
pub struct ListenerSettings {
    pub data: Option<Arc<ListenerTls>>,
    pub admin: Option<Arc<ListenerTls>>,
}

impl Compiled {
    /// Reads, checks and compiles the file at `path`.
    pub fn load(path: &Path) -> Result<Compiled, ConfigError> {
        Compiled::new(load_file(path)?, path)
    }

    /// Checks and compiles configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Compiled, ConfigError> {
        Compiled::new(parse_str(text, origin)?, origin)
    }

    /// Compiles the routes of `config`, which came from `origin`.
    pub fn new(config: Config, origin: &Path) -> Result<Compiled, ConfigError> {
        let routes = RouteTable::compile(&config.routes).map_err(|e| ConfigError::Invalid {
            file: origin.to_owned(),
            route: Some(e.route),
            field: e.field.to_owned(),
            message: e.message,
        })?;
        let invalid = |table: &str, e: ListenerTlsError| {
            let (field, message) = match &e {
                ListenerTlsError::File { field, source } => (*field, source.to_string()),
                ListenerTlsError::ClientCa(message) => ("client_ca", message.clone()),
                ListenerTlsError::Settings(error) => ("tls", error.to_string()),
            };
            ConfigError::Invalid {
                file: origin.to_owned(),
                route: None,
                field: format!("{table}.{field}"),
                message,
            }
        };
        let data = match &config.server.tls {
            None => None,
            Some(tls) => Some(Arc::new(
                ListenerTls::data_plane(tls).map_err(|e| invalid("server.tls", e))?,
            )),
        };
        let admin = match config.admin.as_ref().and_then(|admin| admin.tls.as_ref()) {
            None => None,
            Some(tls) => Some(Arc::new(
                ListenerTls::admin(tls).map_err(|e| invalid("admin.tls", e))?,
            )),
        };
        crate::store::check_settings(&config.store).map_err(|e| ConfigError::Invalid {
            file: origin.to_owned(),
            route: None,
            field: format!("store.{}", e.field),
            message: e.message,
        })?;
        Ok(Compiled {
            config,
            routes,
            listeners: ListenerSettings { data, admin },
        })
    }
}
