//! ZooKeeper lock contenders as the lock recipe takes them, for the authority tests: an ephemeral
//! sequential child of the lock node, named as the plain recipe or Curator names it, in a
//! session of its own that can end by a close (an unlock) or by expiring (a paused holder).
//! ZooKeeper itself is started by scripts/zookeeper-setup.sh on 127.0.0.1:2181.

use std::time::Duration;

use zookeeper_client as zk;

pub const ZK_HOSTS: &str = "127.0.0.1:2181";

/// A root of its own for one test's locks (`/fencegate-test-<uuid>`).
pub fn unique_root() -> String {
    format!("/fencegate-test-{}", uuid::Uuid::new_v4().simple())
}

/// How a contender names its node.
#[derive(Debug, Clone, Copy)]
pub enum Naming {
    /// `lock-0000000007`
    Plain,
    /// Curator's `InterProcessMutex`: `_c_<uuid>-lock-0000000007`
    Curator,
}

/// One contender's node, in its own session.
pub struct ZkContender {
    client: zk::Client,
    pub path: String,
    /// The node's sequence number: the token once it holds the lock.
    pub token: u64,
    /// The transaction id that created the node.
    pub czxid: u64,
}

async fn session(timeout: Duration, detached: bool, digest: Option<&str>) -> zk::Client {
    let mut connector = zk::Client::connector().with_session_timeout(timeout);
    if detached {
        connector = connector.with_detached();
    }
    if let Some(digest) = digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    connector
        .connect(ZK_HOSTS)
        .await
        .unwrap_or_else(|e| panic!("ZooKeeper at {ZK_HOSTS} (scripts/zookeeper-setup.sh): {e}"))
}

/// Creates `lock` (and its parents) if missing, then a contender's node under it, in a session of
/// `timeout` that expires `timeout` after [`ZkContender::pause`].
pub async fn zk_contend(lock: &str, naming: Naming, timeout: Duration) -> ZkContender {
    zk_contend_as(lock, naming, timeout, None).await
}

/// [`zk_contend`] in a session authenticated as `digest` (`user:password`), every node it makes
/// readable by that user alone (ZooKeeper's `auth` ACL).
pub async fn zk_contend_as(
    lock: &str,
    naming: Naming,
    timeout: Duration,
    digest: Option<&str>,
) -> ZkContender {
    let client = session(timeout, true, digest).await;
    let acls = if digest.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    };
    match client
        .mkdir(lock, &zk::CreateMode::Persistent.with_acls(acls))
        .await
    {
        Ok(()) | Err(zk::Error::NodeExists) => {}
        Err(e) => panic!("creating {lock}: {e}"),
    }
    let prefix = match naming {
        Naming::Plain => format!("{lock}/lock-"),
        Naming::Curator => format!("{lock}/_c_{}-lock-", uuid::Uuid::new_v4()),
    };
    let (stat, sequence) = client
        .create(
            &prefix,
            &[],
            &zk::CreateMode::EphemeralSequential.with_acls(acls),
        )
        .await
        .unwrap_or_else(|e| panic!("creating a contender under {lock}: {e}"));
    let path = format!("{prefix}{sequence}");
    ZkContender {
        client,
        path,
        token: u64::try_from(sequence.into_i64()).expect("a sequence number"),
        czxid: u64::try_from(stat.czxid).expect("a czxid"),
    }
}

impl ZkContender {
    /// Releases the lock: deletes the node (the detached session itself expires later).
    pub async fn release(self) {
        match self.client.delete(&self.path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => panic!("deleting {}: {e}", self.path),
        }
    }

    /// The holder pauses: it stops answering ZooKeeper, whose session (and node) then expires,
    /// as a process frozen past its session timeout does.
    pub fn pause(self) {
        // Detached: dropping the last handle stops the heartbeats without closing the session.
        drop(self.client);
    }
}

/// A session for watching and cleaning up.
pub async fn zk_observer() -> zk::Client {
    session(Duration::from_secs(10), false, None).await
}

/// [`zk_observer`] authenticated as `digest` (`user:password`).
pub async fn zk_observer_as(digest: &str) -> zk::Client {
    session(Duration::from_secs(10), false, Some(digest)).await
}

/// Waits until `path` is gone (a session expired takes its ephemeral nodes), up to `within`;
/// answers its parent's `pzxid` then: the zxid of the delete, or of a later change of the
/// parent's children.
pub async fn zk_gone(observer: &zk::Client, path: &str, within: Duration) -> i64 {
    let started = std::time::Instant::now();
    let parent = path.rsplit_once('/').map_or("/", |(p, _)| p);
    loop {
        match observer.check_stat(path).await {
            Ok(None) => break,
            Ok(Some(_)) => {}
            Err(e) => panic!("reading {path}: {e}"),
        }
        assert!(
            started.elapsed() < within,
            "{path} still there after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    observer
        .check_stat(parent)
        .await
        .ok()
        .flatten()
        .map_or(0, |stat| stat.pzxid)
}

/// The sequence number of `lock`'s lowest contender: the holder's token.
pub async fn zk_holder(observer: &zk::Client, lock: &str) -> Option<u64> {
    let children = observer.list_children(lock).await.ok()?;
    children
        .iter()
        .filter_map(|child| child.get(child.len().checked_sub(10)?..)?.parse().ok())
        .min()
}

/// Deletes `root` and everything below it.
pub async fn zk_delete_tree(observer: &zk::Client, root: &str) {
    let mut stack = vec![root.to_owned()];
    let mut order = Vec::new();
    while let Some(path) = stack.pop() {
        if let Ok(children) = observer.list_children(&path).await {
            stack.extend(children.iter().map(|c| format!("{path}/{c}")));
        }
        order.push(path);
    }
    for path in order.iter().rev() {
        let _ = observer.delete(path, None).await;
    }
}
