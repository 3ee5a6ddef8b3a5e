//! The store behind one fault-matrix cell: the embedded file in a temporary directory, or
//! PostgreSQL / Redis reached through a [`Relay`] the test can cut, stall and reset, under a schema
//! or key prefix of the cell's own.

use super::relay::Relay;

/// Which backend a cell runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Embedded,
    Postgres,
    Redis,
}

/// The store of one cell: a temporary directory for the gateway's state (and the embedded file),
/// and for the network stores a relay and a schema or key prefix of the cell's own.
pub struct Backing {
    store: Store,
    /// The gateway's state directory (and the embedded store's file).
    pub dir: tempfile::TempDir,
    relay: Option<Relay>,
    namespace: String,
}

impl Backing {
    pub async fn new(store: Store) -> Backing {
        let dir = tempfile::tempdir().expect("temp dir");
        let (relay, namespace) = match store {
            Store::Embedded => (None, String::new()),
            Store::Postgres => (
                Some(Relay::start("127.0.0.1:5432".parse().expect("address")).await),
                super::postgres::unique_schema(),
            ),
            Store::Redis => (
                Some(Relay::start(super::redis::REDIS_ADDR.parse().expect("address")).await),
                super::redis::unique_prefix(),
            ),
        };
        Backing {
            store,
            dir,
            relay,
            namespace,
        }
    }

    /// The `[store]` table.
    pub fn toml(&self) -> String {
        let through = |relay: &Option<Relay>| relay.as_ref().map(|r| r.addr.to_string());
        match self.store {
            Store::Embedded => super::gateway::embedded_store(self.dir.path()),
            Store::Postgres => format!(
                "[store]\nbackend = \"postgres\"\nurl = \"postgres://postgres@{}/test\"\nschema = \"{}\"\nmax_connections = 4\n",
                through(&self.relay).unwrap_or_default(),
                self.namespace
            ),
            Store::Redis => format!(
                "[store]\nbackend = \"redis\"\nurl = \"redis://{}\"\nkey_prefix = \"{}\"\n",
                through(&self.relay).unwrap_or_default(),
                self.namespace
            ),
        }
    }

    pub fn relay(&self) -> &Relay {
        self.relay.as_ref().expect("a network store has a relay")
    }

    /// Drops the cell's schema or deletes its keys.
    pub async fn clean_up(&self) {
        match self.store {
            Store::Embedded => {}
            Store::Postgres => super::postgres::drop_schema(&self.namespace).await,
            Store::Redis => super::redis::delete_keys(&self.namespace).await,
        }
    }
}
