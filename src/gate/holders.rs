//! The lock-holder sessions of one gateway: one per thread that asks (each serving thread), run
//! on that thread's runtime, so an entry and its answer wake no other thread; and, per lock one of
//! them holds, which one. A key entered again before its release has run goes to the session that
//! still holds it, which takes it again at once instead of finding it held.

use std::sync::Arc;

use dashmap::DashMap;
use sqlx::postgres::PgConnectOptions;

use super::lock_holder::{Holding, LockHolder};
use crate::store::per_thread::{PerThread, TaskQueue as _};
use crate::store::StoreError;

pub struct Holders {
    options: PgConnectOptions,
    per_thread: PerThread<LockHolder>,
    holding: Arc<Holding>,
}

impl Holders {
    pub fn new(options: PgConnectOptions) -> Holders {
        Holders {
            options,
            per_thread: PerThread::new(),
            holding: Arc::new(DashMap::new()),
        }
    }

    /// The session to try `lock` in: the one of this gateway that holds it, if any, else the
    /// calling thread's, started on the calling runtime if there is none (or its runtime ended).
    /// `Closed` after [`close`](Self::close).
    pub fn for_lock(&self, lock: i64) -> Result<LockHolder, StoreError> {
        let holding = self.holding.get(&lock).filter(|h| !h.is_closed());
        if let Some(holder) = holding.as_deref() {
            return Ok(holder.clone());
        }
        drop(holding);
        self.per_thread
            .queue(|| LockHolder::start(self.options.clone(), Arc::clone(&self.holding)))
    }

    /// No holder starts after this; running ones end with their runtimes.
    pub fn close(&self) {
        drop(self.per_thread.close());
    }
}
