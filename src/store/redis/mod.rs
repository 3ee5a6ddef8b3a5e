//! The Redis backend: marks as decimal strings under `{key_prefix}mark:{key}`, and the `RedisStore`
//! handle with one writer task per serving thread, each owning its own connection and sending each
//! batch of its thread's concurrent requests as one pipeline. Scripts: `script.rs` (advance),
//! `turn_scripts.rs` (key turns), `intents.rs`; persistence check: `durability.rs`.
//!
//! The writers: `pool.rs` (one per serving thread), `writer.rs` (the task), `pipeline.rs` (its
//! round trip), `command.rs` (what a writer is sent), `connection.rs` (connecting, loading the
//! scripts). `fence.rs`: the `FenceStore` impl; `keys.rs`: key names; `error.rs`: errors;
//! `tls.rs`: the client for a `rediss://` URL.

mod command;
mod connection;
mod durability;
mod error;
mod fence;
mod intents;
mod keys;
mod pipeline;
mod pool;
mod script;
mod tls;
mod turn_scripts;
mod turns;
mod writer;

use std::sync::Arc;

use redis::Script;
use tokio::sync::oneshot;

use crate::config::RedisStoreConfig;
use crate::store::expected::ExpectedIdentity;
use crate::store::plumbing::per_thread::PerThread;
use crate::store::plumbing::redact::redact_password;
use crate::store::StoreError;
use command::Command;
use connection::{connect, load_scripts, CONNECT_TIMEOUT};
use durability::{judge_durability, read_persistence, Durability};
use error::BACKEND;
use intents::IntentScripts;
use pool::WriterPool;
use turn_scripts::TurnScripts;
pub use turns::RedisTurns;
use writer::WriterTemplate;

/// Checks the store's URL and TLS settings as opening it would, without connecting
/// (`check-config`).
pub fn check_tls(config: &RedisStoreConfig) -> Result<(), crate::tls::StoreTlsError> {
    tls::client(config).map(drop)
}

/// Handle to the writer tasks; cheap to share behind an `Arc`.
///
/// A writer task runs on the thread (runtime) of the requests it serves, and so does its
/// connection's I/O: a request reaches Redis without waking another thread. Each script is atomic
/// on the server, so writers on different connections need no coordination (I1, I2 hold per
/// script call). The first writer uses the connection `open` checked; the others connect when
/// their thread first asks.
pub struct RedisStore {
    writers: Arc<WriterPool>,
    prefix: String,
    /// For their hashes: the writer loads the scripts on the server.
    scripts: IntentScripts,
    expected: Arc<ExpectedIdentity>,
}

impl RedisStore {
    /// Connects to the server, loads the scripts, checks the persistence settings and
    /// starts the writer task.
    pub async fn open(config: &RedisStoreConfig) -> Result<RedisStore, StoreError> {
        let url = redact_password(&config.url);
        let setup = |detail: String| StoreError::Setup {
            backend: BACKEND,
            detail,
        };
        let client = tls::client(config)
            .map_err(|e| setup(format!("{url}: store.{}: {}", e.field, e.message)))?;
        let mut connection = connect(&client, CONNECT_TIMEOUT).await.map_err(|e| {
            setup(format!(
                "cannot connect to {url} (waited up to {}s): {e}",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?;
        let script = Script::new(&script::advance_script());
        let intent_scripts = IntentScripts::new();
        let turn_scripts = TurnScripts::new();
        let expected = Arc::new(ExpectedIdentity::default());
        load_scripts(&mut connection, &script, &intent_scripts, &turn_scripts)
            .await
            .map_err(|e| setup(format!("{url}: cannot load the scripts: {e}")))?;
        let found = read_persistence(&mut connection)
            .await
            .map_err(|e| setup(format!("{url}: cannot read the persistence settings: {e}")))?;
        match judge_durability(
            found.as_ref().map_err(String::as_str),
            config.require_durable,
        ) {
            Durability::Durable => {}
            Durability::Warn(message) => tracing::warn!(url = %url, "redis store: {message}"),
            Durability::Refuse(detail) => return Err(setup(format!("{url}: {detail}"))),
        }
        let template = WriterTemplate {
            client,
            script,
            intent_scripts,
            turn_scripts,
            prefix: config.key_prefix.clone(),
            max_batch: config.max_batch.max(1),
            url,
            expected: Arc::clone(&expected),
        };
        let writers = PerThread::new();
        // The opening thread's writer keeps the connection checked above.
        writers.queue(|| template.spawn(Some(connection)))?;
        Ok(RedisStore {
            writers: Arc::new(WriterPool { writers, template }),
            prefix: config.key_prefix.clone(),
            scripts: IntentScripts::new(),
            expected,
        })
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        self.writers.request(make).await
    }

    /// The key turns of this store (for the ordering gate), taken under the name `holder`, on
    /// the same writers.
    pub fn turns(&self, holder: &str) -> RedisTurns {
        RedisTurns {
            writers: Arc::clone(&self.writers),
            prefix: self.prefix.clone(),
            holder: holder.to_owned(),
            expected: Arc::clone(&self.expected),
            scripts: TurnScripts::new(),
        }
    }
}
