//! Fuzzes the configuration loader: arbitrary text through `config::parse_str`, the same parsing
//! and validation `load_file` (and so `fencegate check-config` and start-up) applies.
#![no_main]

use std::path::Path;

use fencegate::config::{parse_str, ConfigError};
use fencegate::route::RouteTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_str(text, Path::new("fuzz.toml")) {
        Ok(config) => {
            // What validation accepted, the server compiles again without complaint.
            let table = RouteTable::compile(&config.routes);
            assert!(
                table.is_ok(),
                "validated routes failed to compile: {table:?}"
            );
        }
        Err(error) => {
            // Every error names the file it came from.
            let message = error.to_string();
            assert!(message.starts_with("fuzz.toml: "), "{message}");
            if let ConfigError::Invalid { field, .. } = &error {
                assert!(!field.is_empty(), "{message}");
            }
        }
    }
});
