//! How a ZooKeeper lock is read: its holder from its children (and the holder's node), every lock
//! node below the watch's root, and a batch of holders for `strict`'s confirm.

use std::collections::HashMap;
use std::sync::PoisonError;

use futures_util::future::try_join_all;
use zookeeper_client as zk;

use super::names::{child_path, lowest_contender};
use super::{Read, ZookeeperLocks, HOLDER_READS, READS_IN_FLIGHT};
use crate::authority::view::Holder;
use crate::config::ZookeeperToken;

impl ZookeeperLocks {
    /// `call` within the request timeout: ZooKeeper's own answer, or why none came.
    pub(super) async fn within<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<Result<T, zk::Error>, String> {
        tokio::time::timeout(self.request_timeout, call)
            .await
            .map_err(|_| format!("{what}: no answer within {:?}", self.request_timeout))
    }

    /// [`within`](Self::within), any error of ZooKeeper's a failure too.
    pub(super) async fn bounded<T>(
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
    pub(super) async fn read_lock(&self, client: &zk::Client, lock: &str) -> Result<Read, String> {
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

    /// The holders of `locks` (each with its resource), [`READS_IN_FLIGHT`] read at once, as
    /// `(resource, holder)`; `reached` rises to the highest pzxid read.
    pub(super) async fn read_locks(
        &self,
        client: &zk::Client,
        locks: &[(String, String)],
        reached: &mut i64,
    ) -> Result<Vec<(String, Option<Holder>)>, String> {
        let mut holders = Vec::with_capacity(locks.len());
        for chunk in locks.chunks(READS_IN_FLIGHT) {
            let reads =
                try_join_all(chunk.iter().map(|(lock, _)| self.read_lock(client, lock))).await?;
            for ((lock, resource), read) in chunk.iter().zip(reads) {
                *reached = (*reached).max(read.pzxid);
                let holder = read.holder.map(|token| Holder {
                    lock: lock.clone(),
                    token,
                });
                holders.push((resource.clone(), holder));
            }
        }
        Ok(holders)
    }

    /// Every lock node below the root, as the mapping names them, with its resource.
    pub(super) async fn lock_nodes(
        &self,
        client: &zk::Client,
    ) -> Result<Vec<(String, String)>, String> {
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

    pub(super) async fn read_holders(&self, locks: &[String]) -> Result<Vec<Option<u64>>, String> {
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
}
