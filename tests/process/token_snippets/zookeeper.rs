//! The ZooKeeper snippets (the hand-made recipe, kazoo's `Lock`, Curator's `InterProcessMutex`,
//! the Rust worker) against ZooKeeper at 127.0.0.1:2181, each test in a root of its own, deleted
//! at the end, passed or failed.

use std::future::Future;

use super::{
    holder_followed_by_the_authority_watch, require_python_module, two_holders_then_a_zombie,
    PYTHON_INSTALL,
};
use crate::support::zookeeper::{unique_root, zk_delete_tree, zk_observer, ZK_HOSTS};

/// Runs `test` with a ZooKeeper root of its own (`/fencegate-test-<uuid>`), then deletes the
/// tree below it, whether the test passed or not. Fails, naming the server, without ZooKeeper.
async fn with_zookeeper_root<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let root = unique_root();
    let observer = zk_observer().await;
    let outcome = tokio::spawn(test(root.clone())).await;
    zk_delete_tree(&observer, &root).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The arguments of the ZooKeeper snippets: `GATEWAY_URL --zk HOSTS --lock LOCK`.
fn zookeeper_snippet_args(lock: &str) -> impl Fn(String) -> Vec<String> + '_ {
    move |url| {
        vec![
            url,
            "--zk".to_owned(),
            ZK_HOSTS.to_owned(),
            "--lock".to_owned(),
            lock.to_owned(),
        ]
    }
}

/// Panics unless `lock` has no contender left: each holder released its node.
async fn assert_released(lock: &str) {
    let observer = zk_observer().await;
    assert_eq!(
        observer
            .list_children(lock)
            .await
            .unwrap_or_else(|e| panic!("listing {lock}: {e}")),
        Vec::<String>::new(),
        "{lock}: a holder's node is left"
    );
}

/// `two_holders_then_a_zombie` with ZooKeeper snippet `name` on `<root>/locks/invoice/42`.
async fn zookeeper_holders_then_a_zombie(name: &'static str) {
    with_zookeeper_root(|root| async move {
        let lock = format!("{root}/locks/invoice/42");
        two_holders_then_a_zombie(name, zookeeper_snippet_args(&lock)).await;
        assert_released(&lock).await;
    })
    .await;
}

/// `holder_followed_by_the_authority_watch` with ZooKeeper snippet `name` on
/// `<root>/locks/invoice/42`, through a route whose authority follows `<root>/locks/invoice/{id}`
/// (`token = "sequence"`: the holder's sequence number, which is what the snippets print).
async fn zookeeper_holder_followed_by_the_authority(name: &'static str) {
    with_zookeeper_root(|root| async move {
        let authority = format!(
            "kind = \"zookeeper\"\nhosts = \"{ZK_HOSTS}\"\n\
             lock_key = \"{root}/locks/invoice/{{id}}\"\ntoken = \"sequence\"\n"
        );
        let lock = format!("{root}/locks/invoice/42");
        holder_followed_by_the_authority_watch(name, &authority, zookeeper_snippet_args(&lock))
            .await;
        assert_released(&lock).await;
    })
    .await;
}

#[tokio::test]
async fn zookeeper_lock_snippet_writes_with_its_nodes_sequence_number() {
    require_python_module("kazoo", PYTHON_INSTALL);
    zookeeper_holders_then_a_zombie("zk_lock.py").await;
}

#[tokio::test]
async fn zookeeper_lock_snippet_is_followed_by_the_zookeeper_authority() {
    require_python_module("kazoo", PYTHON_INSTALL);
    zookeeper_holder_followed_by_the_authority("zk_lock.py").await;
}

#[tokio::test]
async fn kazoo_lock_recipe_writes_with_its_nodes_sequence_number() {
    require_python_module("kazoo", PYTHON_INSTALL);
    zookeeper_holders_then_a_zombie("kazoo_lock.py").await;
}

#[tokio::test]
async fn kazoo_lock_recipe_is_followed_by_the_zookeeper_authority() {
    require_python_module("kazoo", PYTHON_INSTALL);
    zookeeper_holder_followed_by_the_authority("kazoo_lock.py").await;
}

#[tokio::test]
async fn curator_mutex_snippet_writes_with_its_nodes_sequence_number() {
    zookeeper_holders_then_a_zombie("CuratorLock.java").await;
}

#[tokio::test]
async fn curator_mutex_snippet_is_followed_by_the_zookeeper_authority() {
    zookeeper_holder_followed_by_the_authority("CuratorLock.java").await;
}

#[tokio::test]
async fn zookeeper_worker_example_writes_with_its_nodes_sequence_number() {
    with_zookeeper_root(|root| async move {
        let lock = format!("{root}/locks/invoice/42");
        two_holders_then_a_zombie("zk_worker", zookeeper_snippet_args(&lock)).await;
        // Both released: each worker deleted its node.
        assert_released(&lock).await;
    })
    .await;
}
