//! Locks in ZooKeeper (its lock recipe, Curator's `InterProcessMutex`, kazoo's `Lock`), followed
//! one session at a time: a persistent recursive watch on the locks' common parent, each change
//! re-reading its lock (`reads.rs`; names and the holder: `names.rs`); a break ends the session.

mod names;
mod reads;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt as _;
use names::watch_root;
use zookeeper_client as zk;

use super::mapping::LockMapping;
use super::settings::AuthoritySettings;
use super::source::{follow_sessions, Feed, LockSource};
use super::view::Holder;
use crate::config::ZookeeperToken;

/// Reads of a lock whose holder's node went between listing and stat (czxid tokens).
const HOLDER_READS: usize = 3;
/// Locks read at once when a session reads them all.
const READS_IN_FLIGHT: usize = 64;

pub(super) struct ZookeeperLocks {
    hosts: String,
    /// `user:password` for ZooKeeper's digest scheme, sent with every session.
    digest: Option<String>,
    session_timeout: Duration,
    request_timeout: Duration,
    token: ZookeeperToken,
    mapping: LockMapping,
    /// The deepest node above every lock node: the watch's root.
    root: String,
    /// How many levels below `root` the lock nodes are.
    depth: usize,
    /// The session being followed; confirms read through it.
    session: Mutex<Option<zk::Client>>,
}

/// A lock's holder as one read found it, and the lock node's `pzxid` (the last change to its
/// children; 0 when the node is missing).
struct Read {
    holder: Option<u64>,
    pzxid: i64,
}

impl ZookeeperLocks {
    pub(super) fn new(
        hosts: &str,
        token: ZookeeperToken,
        session_timeout: Duration,
        digest: Option<String>,
        settings: &AuthoritySettings,
    ) -> ZookeeperLocks {
        let (root, depth) = watch_root(
            settings.mapping.lock_prefix(),
            settings.mapping.lock_slashes(),
        );
        ZookeeperLocks {
            hosts: hosts.to_owned(),
            digest,
            session_timeout,
            request_timeout: settings.request_timeout,
            token,
            mapping: settings.mapping.clone(),
            root,
            depth,
            session: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<zk::Client, String> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(self.request_timeout);
        if let Some(digest) = &self.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let connecting = connector.connect(&self.hosts);
        match tokio::time::timeout(self.session_timeout, connecting).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(format!("connecting to ZooKeeper ({}): {e}", self.hosts)),
            Err(_) => Err(format!(
                "connecting to ZooKeeper ({}): no session within {:?}",
                self.hosts, self.session_timeout
            )),
        }
    }

    /// The lock an event at `path` touches: its parent's when `path` is a contender, itself when
    /// it is the lock node.
    fn lock_touched(&self, path: &str) -> Option<(String, String)> {
        if let Some((parent, _)) = path.rsplit_once('/') {
            if let Some(resource) = self.mapping.resource_of(parent) {
                return Some((parent.to_owned(), resource));
            }
        }
        let resource = self.mapping.resource_of(path)?;
        Some((path.to_owned(), resource))
    }

    /// One session: watch, read everything, then follow the changes; returns why it ended.
    async fn session(&self, client: &zk::Client, feed: &Feed) -> String {
        // The watch first, so that no change between the read and the watch goes unseen.
        let mut watcher = match self
            .bounded(
                &format!("watching {}", self.root),
                client.watch(&self.root, zk::AddWatchMode::PersistentRecursive),
            )
            .await
        {
            Ok(watcher) => watcher,
            Err(e) => return e,
        };
        // A new session may be served by a follower behind the one the last session used: the
        // sync brings it up to the leader before anything is read, so the view never goes back.
        if let Err(e) = self
            .bounded("syncing with the ZooKeeper leader", client.sync(&self.root))
            .await
        {
            return e;
        }
        let locks = match self.lock_nodes(client).await {
            Ok(locks) => locks,
            Err(e) => return e,
        };
        // The highest pzxid read: every change up to it has been delivered to the watcher.
        let mut reached = 0;
        let holders: HashMap<String, Holder> =
            match self.read_locks(client, &locks, &mut reached).await {
                Ok(read) => read
                    .into_iter()
                    .filter_map(|(resource, holder)| Some((resource, holder?)))
                    .collect(),
                Err(e) => return e,
            };
        let mut pending: BTreeSet<(String, String)> = BTreeSet::new();
        // What was read is trusted only if the session did not break while it was read: a
        // disconnection's report is queued before any answer read after it.
        if let Some(ended) = self.drain(&mut watcher, &mut pending, client) {
            return ended;
        }
        feed.resync(holders, 0);
        loop {
            if pending.is_empty() {
                // Every event up to what the reads saw has been applied: the view is at `reached`.
                feed.apply(Vec::new(), reached);
                let event = watcher.changed().await;
                if let Some(ended) = self.take_event(&event, &mut pending) {
                    return ended;
                }
                continue;
            }
            let touched: Vec<(String, String)> = std::mem::take(&mut pending).into_iter().collect();
            let changes = match self.read_locks(client, &touched, &mut reached).await {
                Ok(changes) => changes,
                Err(e) => return e,
            };
            if let Some(ended) = self.drain(&mut watcher, &mut pending, client) {
                return ended;
            }
            feed.apply(changes, 0);
        }
    }

    /// Takes every event delivered so far, without waiting, into `pending`; answers why the
    /// session ended when one of them, or the client's state now, says it is not connected.
    fn drain(
        &self,
        watcher: &mut zk::PersistentWatcher,
        pending: &mut BTreeSet<(String, String)>,
        client: &zk::Client,
    ) -> Option<String> {
        while let Some(event) = watcher.changed().now_or_never() {
            if let Some(ended) = self.take_event(&event, pending) {
                return Some(ended);
            }
        }
        disconnected(client)
    }

    /// Records the lock `event` touches; answers why the session ended for a session event.
    fn take_event(
        &self,
        event: &zk::WatchedEvent,
        pending: &mut BTreeSet<(String, String)>,
    ) -> Option<String> {
        match event.event_type {
            zk::EventType::Session => match event.session_state {
                zk::SessionState::SyncConnected => None,
                // Events of a disconnection may be lost (the watch is re-added without them): a
                // new session reads everything again.
                state => Some(format!("the ZooKeeper session is {state:?}")),
            },
            zk::EventType::NodeCreated
            | zk::EventType::NodeDeleted
            | zk::EventType::NodeChildrenChanged => {
                if let Some(touched) = self.lock_touched(&event.path) {
                    pending.insert(touched);
                }
                None
            }
            zk::EventType::NodeDataChanged => None,
        }
    }

    fn set_session(&self, client: Option<zk::Client>) {
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = client;
    }
}

impl LockSource for ZookeeperLocks {
    fn follow(self: Arc<Self>, feed: Feed) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            follow_sessions(&feed, || async {
                let client = match self.connect().await {
                    Ok(client) => client,
                    Err(e) => return e,
                };
                self.set_session(Some(client.clone()));
                let ended = self.session(&client, &feed).await;
                self.set_session(None);
                ended
            })
            .await
        })
    }

    fn holders<'a>(
        &'a self,
        locks: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, String>> {
        Box::pin(self.read_holders(locks))
    }
}

/// Why a session can no longer be trusted, if its client is not connected now.
fn disconnected(client: &zk::Client) -> Option<String> {
    match client.state() {
        zk::SessionState::SyncConnected => None,
        state => Some(format!("the ZooKeeper session is {state:?}")),
    }
}
