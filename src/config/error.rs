//! Errors from reading and validating a configuration file; each names the file, and where it
//! applies the route and the field.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {}field `{field}`: {message}", route_prefix(.route))]
    Invalid {
        file: PathBuf,
        route: Option<String>,
        field: String,
        message: String,
    },
    #[error("{file}: {message}")]
    Syntax { file: PathBuf, message: String },
}

fn route_prefix(route: &Option<String>) -> String {
    match route {
        Some(name) => format!("route {name:?}: "),
        None => String::new(),
    }
}
