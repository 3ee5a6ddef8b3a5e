//! The configuration sections a reload cannot apply (`[server]`, `[store]`, `[admin]`,
//! `[telemetry]`): their text as the gateway started with it, to name the ones a later file
//! changes, which wait for a restart.

use std::collections::BTreeMap;

/// The sections only a restart applies, as named in the file.
pub const RESTART_SECTIONS: [&str; 4] = ["server", "store", "admin", "telemetry"];

/// The restart-only sections of one configuration text (absent ones as `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct RestartSections(BTreeMap<&'static str, Option<toml::Value>>);

impl RestartSections {
    /// Reads them from configuration text; text that does not parse has none (the loader
    /// reports its error).
    pub fn parse(text: &str) -> RestartSections {
        let table: toml::Table = text.parse().unwrap_or_default();
        RestartSections(
            RESTART_SECTIONS
                .iter()
                .map(|name| (*name, table.get(*name).cloned()))
                .collect(),
        )
    }

    /// The sections `newer` spells differently, in [`RESTART_SECTIONS`] order.
    pub fn changed_in(&self, newer: &RestartSections) -> Vec<&'static str> {
        RESTART_SECTIONS
            .into_iter()
            .filter(|name| self.0.get(name) != newer.0.get(name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_sections_a_file_changes() {
        let started = RestartSections::parse(
            "[server]\nlisten = \"127.0.0.1:8080\"\n[store]\npath = \"a.db\"\n[[routes]]\nname = \"a\"\n",
        );
        let same_but_routes = RestartSections::parse(
            "[server]\nlisten = \"127.0.0.1:8080\"\n[store]\npath = \"a.db\"\n[[routes]]\nname = \"b\"\n",
        );
        assert!(started.changed_in(&same_but_routes).is_empty());
        let moved = RestartSections::parse(
            "[server]\nlisten = \"127.0.0.1:9090\"\n[admin]\nlisten = \"127.0.0.1:9091\"\n[store]\npath = \"a.db\"\n",
        );
        assert_eq!(started.changed_in(&moved), vec!["server", "admin"]);
    }
}
