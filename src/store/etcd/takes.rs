//! First attempts of turn takes, batched per serving thread: each take's conditional transaction
//! (`turns.rs`) goes, nested, into one transaction with the takes that came while the thread's
//! previous batch was being written, and is answered with its own nested response. A key twice in
//! one batch (etcd refuses a transaction that writes a key twice) has its second take sent alone.

use std::collections::HashSet;

use tokio::sync::oneshot;

use super::error::{unexpected, wrap};
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{RequestOp, ResponseOp, TxnRequest, TxnResponse};
use crate::store::StoreError;

/// One take's transaction, queued for its thread's batch, answered on `reply` with what the
/// transaction answered as if it had been sent alone.
pub(super) struct QueuedTake {
    /// The resource key the transaction writes the turn and mark of.
    pub(super) key: String,
    pub(super) txn: TxnRequest,
    pub(super) reply: oneshot::Sender<Result<TxnResponse, StoreError>>,
}

/// The transaction that holds `txns`, nested, in order: unconditional, so that each runs or not
/// by its own comparisons.
pub(super) fn batch_txn(txns: Vec<TxnRequest>) -> TxnRequest {
    TxnRequest {
        compare: Vec::new(),
        success: txns.into_iter().map(RequestOp::Txn).collect(),
        failure: Vec::new(),
    }
}

/// The nested answers of a [`batch_txn`] of `count` transactions, in order.
fn nested_answers(answer: TxnResponse, count: usize) -> Result<Vec<TxnResponse>, StoreError> {
    if !answer.succeeded || answer.responses.len() != count {
        return Err(unexpected(format!(
            "a batch of {count} takes answered {} responses (succeeded: {})",
            answer.responses.len(),
            answer.succeeded
        )));
    }
    answer
        .responses
        .into_iter()
        .map(|op| match op {
            ResponseOp::Txn(nested) => Ok(nested),
            other => Err(unexpected(format!("a batched take answered {other:?}"))),
        })
        .collect()
}

/// Sends one transaction on its own.
async fn send_alone(client: &EtcdClient, take: QueuedTake) {
    let answer = client.call("/v3/kv/txn", &take.txn).await.map_err(wrap);
    let _ = take.reply.send(answer);
}

/// Writes one batch of takes: the first take of each key together in one transaction (a lone
/// one as it is), then each repeated key's take on its own, in the order they came.
pub(super) async fn run_takes(client: &EtcdClient, batch: Vec<QueuedTake>) {
    let mut keys = HashSet::with_capacity(batch.len());
    let (together, repeated): (Vec<QueuedTake>, Vec<QueuedTake>) = batch
        .into_iter()
        .partition(|take| keys.insert(take.key.clone()));
    if together.len() == 1 {
        for take in together {
            send_alone(client, take).await;
        }
    } else if !together.is_empty() {
        let count = together.len();
        let (txns, replies): (Vec<TxnRequest>, Vec<_>) = together
            .into_iter()
            .map(|take| (take.txn, take.reply))
            .unzip();
        let answer: Result<TxnResponse, StoreError> = client
            .call("/v3/kv/txn", &batch_txn(txns))
            .await
            .map_err(wrap);
        // An error leaves unknown whether each turn was written, as for a take alone: each
        // turn's lease lapses on its own.
        match answer.and_then(|answer| nested_answers(answer, count)) {
            Ok(answers) => {
                for (reply, nested) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(nested));
                }
            }
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(error.again()));
                }
            }
        }
    }
    for take in repeated {
        send_alone(client, take).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::wire::{PutResponse, RangeResponse};

    fn nested(succeeded: bool) -> ResponseOp {
        ResponseOp::Txn(TxnResponse {
            succeeded,
            responses: vec![ResponseOp::Range(RangeResponse::default())],
            ..Default::default()
        })
    }

    #[test]
    fn each_take_gets_its_own_nested_answer_in_order() {
        let answer = TxnResponse {
            succeeded: true,
            responses: vec![nested(true), nested(false)],
            ..Default::default()
        };
        let answers = nested_answers(answer, 2).expect("two answers");
        assert_eq!(
            answers.iter().map(|a| a.succeeded).collect::<Vec<_>>(),
            [true, false]
        );
    }

    #[test]
    fn a_batch_answered_short_or_with_other_operations_is_an_error() {
        let short = TxnResponse {
            succeeded: true,
            responses: vec![nested(true)],
            ..Default::default()
        };
        assert!(nested_answers(short, 2).is_err());
        let not_a_txn = TxnResponse {
            succeeded: true,
            responses: vec![ResponseOp::Put(PutResponse { prev_kv: None })],
            ..Default::default()
        };
        assert!(nested_answers(not_a_txn, 1).is_err());
        let not_run = TxnResponse {
            succeeded: false,
            responses: Vec::new(),
            ..Default::default()
        };
        assert!(nested_answers(not_run, 0).is_err());
    }
}
