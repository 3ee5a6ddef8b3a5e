//! Opening the backend the `[store]` table names, and checking its settings without connecting
//! (what `check-config` runs); the backends a build left out answer that they are not built.

use std::sync::Arc;

#[cfg(feature = "etcd")]
use super::EtcdStore;
#[cfg(feature = "postgres")]
use super::PostgresStore;
#[cfg(feature = "redis")]
use super::RedisStore;
use super::{AdvanceAndBegin, EmbeddedStore, FenceStore, IntentStore, StoreError, TurnStore};
use crate::config::StoreConfig;

/// One opened backend, seen through both of its traits, and its key turns where it can keep
/// them for several replicas (PostgreSQL, Redis, etcd).
#[derive(Clone)]
pub struct Backend {
    pub fences: Arc<dyn FenceStore>,
    pub intents: Arc<dyn IntentStore>,
    pub turns: Option<Arc<dyn TurnStore>>,
    /// The same backend's advance-and-begin round, where it has one.
    pub combined: Option<Arc<dyn AdvanceAndBegin>>,
}

impl Backend {
    /// A backend that also has an advance-and-begin round.
    fn with_combined<T: FenceStore + IntentStore + AdvanceAndBegin>(
        store: T,
        turns: Option<Arc<dyn TurnStore>>,
    ) -> Backend {
        let store = Arc::new(store);
        Backend {
            fences: Arc::clone(&store) as Arc<dyn FenceStore>,
            intents: Arc::clone(&store) as Arc<dyn IntentStore>,
            turns,
            combined: Some(store),
        }
    }
}

/// Checks a network store's URL and TLS files as opening it would, without connecting: what
/// `check-config` runs. `Err` names the field below `store.`.
pub fn check_settings(config: &StoreConfig) -> Result<(), crate::tls::StoreTlsError> {
    match config {
        StoreConfig::Embedded(_) => Ok(()),
        #[cfg(feature = "postgres")]
        StoreConfig::Postgres(postgres) => super::postgres::check_tls(postgres),
        #[cfg(feature = "redis")]
        StoreConfig::Redis(redis) => super::redis::check_tls(redis),
        #[cfg(feature = "etcd")]
        StoreConfig::Etcd(etcd) => super::etcd::check_tls(etcd),
        #[cfg(not(all(feature = "postgres", feature = "redis", feature = "etcd")))]
        other => Err(crate::tls::StoreTlsError::new("backend", not_built(other))),
    }
}

/// Opens the backend the configuration names; its key turns, if it keeps them, are taken under
/// the name `holder` (see [`Replica`](crate::guard::Replica)).
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "etcd")),
    allow(unused_variables)
)]
pub async fn open(config: &StoreConfig, holder: &str) -> Result<Backend, StoreError> {
    Ok(match config {
        StoreConfig::Embedded(embedded) => {
            let store = EmbeddedStore::open(&embedded.path, embedded.max_batch).await?;
            Backend::with_combined(store, None)
        }
        #[cfg(feature = "postgres")]
        StoreConfig::Postgres(postgres) => {
            let store = PostgresStore::open(postgres).await?;
            let turns = store.turns(holder);
            Backend::with_combined(store, Some(Arc::new(turns)))
        }
        #[cfg(feature = "redis")]
        StoreConfig::Redis(redis) => {
            let store = RedisStore::open(redis).await?;
            let turns = store.turns(holder);
            Backend::with_combined(store, Some(Arc::new(turns)))
        }
        #[cfg(feature = "etcd")]
        StoreConfig::Etcd(etcd) => {
            let store = EtcdStore::open(etcd).await?;
            let turns = store.turns(holder);
            Backend::with_combined(store, Some(Arc::new(turns)))
        }
        #[cfg(not(all(feature = "postgres", feature = "redis", feature = "etcd")))]
        other => {
            return Err(StoreError::Setup {
                backend: other.backend(),
                detail: not_built(other),
            })
        }
    })
}

/// Why `config`'s backend cannot be opened or checked: this build left it out. (`check-config`
/// refuses such a configuration first: `config::check_built`.)
#[cfg(not(all(feature = "postgres", feature = "redis", feature = "etcd")))]
fn not_built(config: &StoreConfig) -> String {
    crate::config::not_built_message(&format!("{} store", config.backend()), config.backend())
}
