//! Locks in a PostgreSQL lease table, `(lock_key, owner, fence, expires_at)` as in
//! docs/getting-tokens.md: a row whose `expires_at` is in the future (by the database's clock)
//! is held, its `fence` the token. Followed by reading the table every `poll_interval`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row as _;

use super::mapping::LockMapping;
use super::settings::AuthoritySettings;
use super::source::{Feed, LockSource};
use super::view::Holder;

/// Connections to the lease table's database: one for the poll, one for confirms.
const CONNECTIONS: u32 = 2;

pub(super) struct PostgresLeases {
    pool: PgPool,
    mapping: LockMapping,
    poll_interval: Duration,
    /// `SELECT ... WHERE lock_key LIKE $1`: every row of this mapping's locks.
    scan: String,
    /// `SELECT ... WHERE lock_key = ANY($1)` and live.
    confirm: String,
}

impl PostgresLeases {
    pub(super) fn new(
        url: &str,
        table: &str,
        poll_interval: Duration,
        settings: &AuthoritySettings,
    ) -> Result<PostgresLeases, String> {
        let pool = PgPoolOptions::new()
            .max_connections(CONNECTIONS)
            .acquire_timeout(settings.request_timeout)
            .connect_lazy(url)
            .map_err(|e| format!("the lease table's url: {e}"))?;
        Ok(PostgresLeases {
            pool,
            mapping: settings.mapping.clone(),
            poll_interval,
            scan: format!(
                "SELECT lock_key, fence, expires_at > now() AS live FROM {table} WHERE lock_key LIKE $1"
            ),
            confirm: format!(
                "SELECT lock_key, fence FROM {table} WHERE lock_key = ANY($1) AND expires_at > now()"
            ),
        })
    }

    /// Every held lock of the mapping, as the database sees it now.
    async fn read_all(&self) -> Result<HashMap<String, Holder>, String> {
        let pattern = format!("{}%", like_escaped(self.mapping.lock_prefix()));
        let rows = sqlx::query(&self.scan)
            .bind(pattern)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| format!("reading the lease table: {e}"))?;
        let mut holders = HashMap::new();
        for row in rows {
            let lock: String = row.try_get(0).map_err(|e| e.to_string())?;
            let fence: i64 = row.try_get(1).map_err(|e| e.to_string())?;
            let live: bool = row.try_get(2).map_err(|e| e.to_string())?;
            let (Some(resource), Ok(token), true) =
                (self.mapping.resource_of(&lock), u64::try_from(fence), live)
            else {
                continue;
            };
            holders.insert(resource, Holder { lock, token });
        }
        Ok(holders)
    }

    async fn read_holders(&self, locks: &[String]) -> Result<Vec<Option<u64>>, String> {
        let rows = sqlx::query(&self.confirm)
            .bind(locks)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| format!("confirming holders: {e}"))?;
        let mut live: HashMap<String, u64> = HashMap::new();
        for row in rows {
            let lock: String = row.try_get(0).map_err(|e| e.to_string())?;
            let fence: i64 = row.try_get(1).map_err(|e| e.to_string())?;
            if let Ok(token) = u64::try_from(fence) {
                live.insert(lock, token);
            }
        }
        Ok(locks.iter().map(|lock| live.get(lock).copied()).collect())
    }
}

impl LockSource for PostgresLeases {
    fn follow(self: Arc<Self>, feed: Feed) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut ticks = tokio::time::interval(self.poll_interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match self.read_all().await {
                    Ok(holders) => feed.resync(holders, 0),
                    Err(why) => feed.lost(why),
                }
            }
        })
    }

    fn holders<'a>(
        &'a self,
        locks: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, String>> {
        Box::pin(self.read_holders(locks))
    }
}

/// `text` with LIKE's wildcards and its escape character escaped.
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn like_wildcards_are_escaped() {
        assert_eq!(super::like_escaped("lock_key%\\"), "lock\\_key\\%\\\\");
    }
}
