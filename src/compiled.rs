//! A configuration compiled once: the plain data `config` reads and checks, and the route table
//! compiled from it. `check-config`, `serve`, the one-shot commands and every reload go through
//! here, so what `check-config` accepts is exactly what `serve` runs.

use std::path::Path;

use crate::config::{load_file, parse_str, Config, ConfigError};
use crate::route::RouteTable;

/// A configuration whose routes compiled.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub config: Config,
    pub routes: RouteTable,
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
        Ok(Compiled { config, routes })
    }
}
