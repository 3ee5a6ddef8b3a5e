//! Locks in ZooKeeper, as its lock recipe and Curator's `InterProcessMutex` take them: each
//! contender creates an ephemeral sequential child of the lock node (`lock-0000000007`, Curator's
//! `_c_<uuid>-lock-0000000007`, kazoo's `<uuid>__lock__0000000007`), the lowest sequence number
//! holds the lock, and that number (or the child's czxid) is the token; a session that ends takes
//! its child with it. Followed by a persistent recursive watch on the locks' common parent, each
//! change re-reading its lock's children; a break ends the session and the next one reads all.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::{try_join_all, BoxFuture};
use futures_util::FutureExt as _;
use zookeeper_client as zk;

use super::mapping::LockMapping;
use super::settings::AuthoritySettings;
use super::source::{follow_sessions, Feed, LockSource};
use super::view::Holder;
use crate::config::ZookeeperToken;

/// Digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;
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

    /// `call` within the request timeout: ZooKeeper's own answer, or why none came.
    async fn within<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<Result<T, zk::Error>, String> {
        tokio::time::timeout(self.request_timeout, call)
            .await
            .map_err(|_| format!("{what}: no answer within {:?}", self.request_timeout))
    }

    /// [`within`](Self::within), any error of ZooKeeper's a failure too.
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, String> {
        self.within(what, call)
            .await?
            .map_err(|e| format!("{what}: {e}"))
    }

    /// `lock`'s holder now: its lowest sequential child. The holder's node is read too (its data
    /// and stat), so that a gateway without READ on the contenders fails instead of following
    /// locks whose changes ZooKeeper does not tell it of.
    async fn read_lock(&self, client: &zk::Client, lock: &str) -> Result<Read, String> {
        let what = format!("reading {lock}");
        for _ in 0..HOLDER_READS {
            let (children, stat) = match self.within(&what, client.get_children(lock)).await? {
                Ok(listed) => listed,
                // No such node, or a path no node can have (the client refuses it): no holder.
                Err(zk::Error::NoNode | zk::Error::BadArguments(_)) => {
                    return Ok(Read {
                        holder: None,
                        pzxid: 0,
                    })
                }
                Err(e) => return Err(format!("{what}: {e}")),
            };
            if stat.cversion < 0 {
                // Sequence numbers come from this counter: once it wraps, names stop sorting in
                // the order of the grants, and no holder can be named.
                return Err(format!(
                    "{what}: its child counter wrapped ({}): the lock node must be made again",
                    stat.cversion
                ));
            }
            let Some((child, sequence)) = lowest_contender(&children) else {
                return Ok(Read {
                    holder: None,
                    pzxid: stat.pzxid,
                });
            };
            let path = format!("{lock}/{child}");
            let node = match self.within(&what, client.get_data(&path)).await? {
                Ok((_, node)) => node,
                // The holder's node went since the listing: list again.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(format!("reading {path}: {e}")),
            };
            let token = match self.token {
                ZookeeperToken::Sequence => sequence,
                ZookeeperToken::Czxid => u64::try_from(node.czxid)
                    .map_err(|_| format!("{path}: czxid {} below zero", node.czxid))?,
            };
            return Ok(Read {
                holder: Some(token),
                pzxid: stat.pzxid,
            });
        }
        Err(format!(
            "{what}: its holder changed {HOLDER_READS} times while it was read"
        ))
    }

    /// Every lock node below the root, as the mapping names them, with its resource.
    async fn lock_nodes(&self, client: &zk::Client) -> Result<Vec<(String, String)>, String> {
        let mut level = vec![self.root.clone()];
        for _ in 0..self.depth {
            let mut next = Vec::new();
            for parent in &level {
                let children = match self
                    .within(&format!("listing {parent}"), client.list_children(parent))
                    .await?
                {
                    Ok(children) => children,
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(format!("listing {parent}: {e}")),
                };
                next.extend(children.into_iter().map(|child| child_path(parent, &child)));
            }
            level = next;
        }
        Ok(level
            .into_iter()
            .filter_map(|lock| {
                let resource = self.mapping.resource_of(&lock)?;
                Some((lock, resource))
            })
            .collect())
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
        let mut holders = HashMap::new();
        // The highest pzxid read: every change up to it has been delivered to the watcher.
        let mut reached = 0;
        // A chunk's reads in flight at once (ZooKeeper answers a session's requests in order).
        for chunk in locks.chunks(READS_IN_FLIGHT) {
            let reads = match try_join_all(
                chunk.iter().map(|(lock, _)| self.read_lock(client, lock)),
            )
            .await
            {
                Ok(reads) => reads,
                Err(e) => return e,
            };
            for ((lock, resource), read) in chunk.iter().zip(reads) {
                reached = reached.max(read.pzxid);
                if let Some(token) = read.holder {
                    holders.insert(
                        resource.clone(),
                        Holder {
                            lock: lock.clone(),
                            token,
                        },
                    );
                }
            }
        }
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
            let mut changes = Vec::with_capacity(touched.len());
            for chunk in touched.chunks(READS_IN_FLIGHT) {
                let reads =
                    match try_join_all(chunk.iter().map(|(lock, _)| self.read_lock(client, lock)))
                        .await
                    {
                        Ok(reads) => reads,
                        Err(e) => return e,
                    };
                for ((lock, resource), read) in chunk.iter().zip(reads) {
                    reached = reached.max(read.pzxid);
                    let holder = read.holder.map(|token| Holder {
                        lock: lock.clone(),
                        token,
                    });
                    changes.push((resource.clone(), holder));
                }
            }
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

    async fn read_holders(&self, locks: &[String]) -> Result<Vec<Option<u64>>, String> {
        let client = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| "no ZooKeeper session".to_owned())?;
        // Reads answer from the server's copy; `sync` brings it up to the leader's first.
        self.bounded("syncing with the ZooKeeper leader", client.sync(&self.root))
            .await?;
        // Every lock's children in one request (a multi-read, answered from one state).
        let mut reader = client.new_multi_reader();
        // A lock whose path the client refuses has no node, so no holder; it is not asked.
        let readable: Vec<&String> = locks
            .iter()
            .filter(|lock| reader.add_get_children(lock).is_ok())
            .collect();
        let listed = self.bounded("reading the locks", reader.commit()).await?;
        if listed.len() != readable.len() {
            return Err(format!(
                "reading the locks: {} answers to {} reads",
                listed.len(),
                readable.len()
            ));
        }
        let mut answers: HashMap<&str, zk::MultiReadResult> = readable
            .into_iter()
            .map(String::as_str)
            .zip(listed)
            .collect();
        let mut holders = Vec::with_capacity(locks.len());
        for lock in locks {
            let Some(answer) = answers.remove(lock.as_str()) else {
                holders.push(None);
                continue;
            };
            let children = match answer {
                zk::MultiReadResult::Children { children } => children,
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => Vec::new(),
                zk::MultiReadResult::Error { err } => return Err(format!("reading {lock}: {err}")),
                // Data, or what a later client version adds: not an answer to this read.
                _ => return Err(format!("reading {lock}: not a list of children")),
            };
            let holder = match (lowest_contender(&children), self.token) {
                (None, _) => None,
                (Some((_, sequence)), ZookeeperToken::Sequence) => Some(sequence),
                // The holder's czxid takes its node's stat: read as the follow reads a lock.
                (Some(_), ZookeeperToken::Czxid) => self.read_lock(&client, lock).await?.holder,
            };
            holders.push(holder);
        }
        Ok(holders)
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

/// The watch's root for locks named from `prefix` (the text before the first placeholder) with
/// `slashes` slashes in all, and how many levels below it the lock nodes are.
fn watch_root(prefix: &str, slashes: usize) -> (String, usize) {
    let root = match prefix.rfind('/') {
        Some(0) | None => "/",
        Some(last) => &prefix[..last],
    };
    let root_level = if root == "/" {
        0
    } else {
        root.matches('/').count()
    };
    (root.to_owned(), slashes.saturating_sub(root_level))
}

/// Why a session can no longer be trusted, if its client is not connected now.
fn disconnected(client: &zk::Client) -> Option<String> {
    match client.state() {
        zk::SessionState::SyncConnected => None,
        state => Some(format!("the ZooKeeper session is {state:?}")),
    }
}

fn child_path(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// A contender's sequence number: the digits ZooKeeper appended to a sequential node's name.
/// Other children (a lease node, a recipe's bookkeeping) are no contenders.
fn sequence_of(child: &str) -> Option<u64> {
    let digits = child.get(child.len().checked_sub(SEQUENCE_DIGITS)?..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The child holding the lock: the lowest sequence number.
fn lowest_contender(children: &[String]) -> Option<(&str, u64)> {
    children
        .iter()
        .filter_map(|child| Some((child.as_str(), sequence_of(child)?)))
        .min_by_key(|(_, sequence)| *sequence)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_names_its_contenders_with_a_sequence_number_at_the_end() {
        // The plain recipe, Curator's InterProcessMutex, kazoo's Lock.
        assert_eq!(sequence_of("lock-0000000007"), Some(7));
        assert_eq!(
            sequence_of("_c_4c3d6b0e-6a5f-4d0e-9a43-1f5b8f0a2c11-lock-0000000012"),
            Some(12)
        );
        assert_eq!(
            sequence_of("2f1c0bbd1d2e4f0c8a5c2f4d0c6e7b1a__lock__0000000003"),
            Some(3)
        );
        // No sequence: not a contender. A wrapped counter's sign is no digit.
        assert_eq!(sequence_of("leases"), None);
        assert_eq!(sequence_of("lock-000000007"), None);
        assert_eq!(sequence_of("lock--000000001"), None);
        assert_eq!(sequence_of("é-000000001"), None);
    }

    #[test]
    fn the_lowest_sequence_holds_whatever_the_names_before_it() {
        let children = [
            "_c_b-lock-0000000009".to_owned(),
            "leases".to_owned(),
            "_c_a-lock-0000000011".to_owned(),
            "_c_c-lock-0000000010".to_owned(),
        ];
        assert_eq!(
            lowest_contender(&children),
            Some(("_c_b-lock-0000000009", 9))
        );
        assert_eq!(lowest_contender(&["leases".to_owned()]), None);
        assert_eq!(lowest_contender(&[]), None);
    }

    #[test]
    fn the_watch_covers_the_deepest_node_above_every_lock() {
        // "/locks/invoice/{id}": 3 slashes, the prefix "/locks/invoice/".
        assert_eq!(
            watch_root("/locks/invoice/", 3),
            ("/locks/invoice".to_owned(), 1)
        );
        // "/locks/inv-{id}".
        assert_eq!(watch_root("/locks/inv-", 2), ("/locks".to_owned(), 1));
        // "/locks/{tenant}/invoice/{id}".
        assert_eq!(watch_root("/locks/", 4), ("/locks".to_owned(), 3));
        // "/{id}" and one fixed lock, "/locks/main".
        assert_eq!(watch_root("/", 1), ("/".to_owned(), 1));
        assert_eq!(watch_root("/locks/main", 2), ("/locks".to_owned(), 1));
        assert_eq!(child_path("/", "locks"), "/locks");
        assert_eq!(child_path("/locks", "7"), "/locks/7");
    }
}
