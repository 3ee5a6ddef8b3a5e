//! What a lock service offers the gateway, whatever it is: a way to follow its locks (reported
//! to a [`Feed`]) and a linearizable read of some locks' holders.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::view::Holder;

/// A lock service the gateway follows.
pub(crate) trait LockSource: Send + Sync + 'static {
    /// Follows the service until the task running it is aborted: every full read goes to
    /// [`Feed::resync`], every change to [`Feed::apply`], every break to [`Feed::lost`].
    fn follow(self: std::sync::Arc<Self>, feed: Feed) -> BoxFuture<'static, ()>;

    /// The current holder's token of each of `locks` (in the same order), read so that no
    /// later grant or end was already acknowledged to anyone.
    fn holders<'a>(
        &'a self,
        locks: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, String>>;
}

/// Where a source reports what it read; implemented by the authority's shared state.
pub(crate) trait FeedSink: Send + Sync + 'static {
    fn resync(&self, holders: HashMap<String, Holder>, revision: i64);
    fn apply(&self, changes: Vec<(String, Option<Holder>)>, revision: i64);
    fn lost(&self, why: String);
}

/// A source's handle on its authority.
#[derive(Clone)]
pub(crate) struct Feed(pub(crate) std::sync::Arc<dyn FeedSink>);

impl Feed {
    /// A full read of every lock: resources missing from `holders` have no holder.
    pub(crate) fn resync(&self, holders: HashMap<String, Holder>, revision: i64) {
        self.0.resync(holders, revision);
    }

    /// Some resources' holders changed (`None`: the lock is free now).
    pub(crate) fn apply(&self, changes: Vec<(String, Option<Holder>)>, revision: i64) {
        if !changes.is_empty() || revision > 0 {
            self.0.apply(changes, revision);
        }
    }

    /// The source cannot follow the service until its next resync.
    pub(crate) fn lost(&self, why: String) {
        self.0.lost(why);
    }
}

/// Pause before following again after a break, doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Follows a lock service one `session` after another until the task is aborted: each session
/// answers why it ended, which goes to [`Feed::lost`]; the pause before the next doubles while
/// sessions keep ending within [`MAX_BACKOFF`], and starts again after one that lasted.
pub(crate) async fn follow_sessions<F, S>(feed: &Feed, mut session: F)
where
    F: FnMut() -> S,
    S: Future<Output = String>,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = tokio::time::Instant::now();
        let why = session().await;
        feed.lost(why);
        if started.elapsed() > MAX_BACKOFF {
            backoff = FIRST_BACKOFF;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A lock service that could not even be set up (its TLS files vanished since the routes
/// compiled): never in sync, every confirm fails, so its routes fail closed.
pub(crate) struct Broken(pub(crate) String);

impl LockSource for Broken {
    fn follow(self: std::sync::Arc<Self>, feed: Feed) -> BoxFuture<'static, ()> {
        Box::pin(async move { feed.lost(self.0.clone()) })
    }

    fn holders<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<Vec<Option<u64>>, String>> {
        Box::pin(async move { Err(self.0.clone()) })
    }
}
