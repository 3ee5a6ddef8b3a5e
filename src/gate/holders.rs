//! The lock-holder sessions of one gateway: one per thread that asks (each serving thread), run
//! on that thread's runtime, so an entry and its answer wake no other thread; and, per lock one of
//! them holds, which one. A key entered again before its release has run goes to the session that
//! still holds it, which takes it again at once instead of finding it held.

use std::sync::Arc;
use std::thread::ThreadId;

use dashmap::DashMap;
use sqlx::postgres::PgConnectOptions;

use super::lock_holder::{Holding, LockHolder};

pub struct Holders {
    options: PgConnectOptions,
    per_thread: DashMap<ThreadId, LockHolder>,
    holding: Arc<Holding>,
}

impl Holders {
    pub fn new(options: PgConnectOptions) -> Holders {
        Holders {
            options,
            per_thread: DashMap::new(),
            holding: Arc::new(DashMap::new()),
        }
    }

    /// The session to try `lock` in: the one of this gateway that holds it, if any, else the
    /// calling thread's, started on the calling runtime if there is none (or its runtime ended).
    pub fn for_lock(&self, lock: i64) -> LockHolder {
        if let Some(holder) = live(self.holding.get(&lock).as_deref()) {
            return holder;
        }
        let thread = std::thread::current().id();
        if let Some(holder) = live(self.per_thread.get(&thread).as_deref()) {
            return holder;
        }
        let holder = LockHolder::start(self.options.clone(), Arc::clone(&self.holding));
        self.per_thread.insert(thread, holder.clone());
        holder
    }
}

fn live(holder: Option<&LockHolder>) -> Option<LockHolder> {
    holder.filter(|h| !h.is_closed()).cloned()
}
