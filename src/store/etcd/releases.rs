//! Releases of key turns, batched per serving thread: each is a conditional delete (only while the
//! key still holds that turn), and the releases that come while a batch is being written go
//! together in the next transaction, a nested transaction each. A release that is lost (a failed
//! call, a full queue after close) leaves the turn to lapse with its lease, as before.

use tokio::sync::{mpsc, watch};

use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{Compare, DeleteRangeRequest, RequestOp, TxnRequest, TxnResponse};
use crate::store::plumbing::per_thread::TaskQueue;

/// One turn to give back: its key, and the value it holds while it is still this turn.
pub(super) struct Release {
    pub(super) turn_key: String,
    pub(super) holding: String,
}

/// A serving thread's release batcher: its queue, and a channel that ends when the batcher does.
#[derive(Clone)]
pub(super) struct ReleaseQueue {
    pub(super) sender: mpsc::Sender<Release>,
    pub(super) ended: watch::Receiver<()>,
}

impl TaskQueue for ReleaseQueue {
    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

fn conditional_delete(release: &Release) -> RequestOp {
    RequestOp::Txn(TxnRequest {
        compare: vec![Compare::value_is(
            release.turn_key.as_str(),
            release.holding.as_str(),
        )],
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
            key: release.turn_key.as_str().into(),
            range_end: Default::default(),
        })],
        failure: Vec::new(),
    })
}

/// Writes one batch of releases as one transaction. A key released twice in one batch (an earlier
/// turn of ours, already replaced by the later one) is right in either order: each conditional
/// delete removes only its own turn.
pub(super) async fn run_releases(client: &EtcdClient, batch: Vec<Release>) {
    let txn = TxnRequest {
        compare: Vec::new(),
        success: batch.iter().map(conditional_delete).collect(),
        failure: Vec::new(),
    };
    let _: Result<TxnResponse, _> = client.call("/v3/kv/txn", &txn).await;
}
