//! The store identity on etcd: a random id in `{prefix}store_id`, created by the first gateway
//! that finds none, joined with the id of the cluster that holds it. A wiped prefix loses the
//! record; a cluster rebuilt from a backup under a new cluster id changes the second half: either
//! way the gateway sees a store it has not adopted (docs/design.md §4.4).

use super::error::{unexpected, wrap};
use super::keys::Keys;
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{Compare, PutRequest, RequestOp, ResponseOp, TxnRequest, TxnResponse};
use crate::store::{new_store_id, StoreError, StoreIdentity};

/// The record's part of an identity (what the transactions compare).
pub(super) fn record_of(id: &str) -> &str {
    id.split('@').next().unwrap_or(id)
}

/// The cluster's part of an identity, when it has one.
pub(super) fn cluster_of(id: &str) -> Option<u64> {
    let (_, cluster) = id.split_once('@')?;
    u64::from_str_radix(cluster, 16).ok()
}

fn identity_of(record: &str, cluster: u64) -> String {
    format!("{record}@{cluster:016x}")
}

/// Reads the identity record, creating it when there is none, in one transaction.
pub(super) async fn identity(
    client: &EtcdClient,
    keys: &Keys,
) -> Result<StoreIdentity, StoreError> {
    let fresh = new_store_id();
    let txn = TxnRequest {
        compare: vec![Compare::absent(keys.store_id())],
        success: vec![RequestOp::Put(PutRequest {
            key: keys.store_id().into(),
            value: fresh.clone().into(),
            lease: 0,
            prev_kv: false,
        })],
        failure: vec![RequestOp::read(&keys.store_id())],
    };
    let answer: TxnResponse = client.call("/v3/kv/txn", &txn).await.map_err(wrap)?;
    let cluster = answer.header.cluster_id;
    if answer.succeeded {
        return Ok(StoreIdentity {
            id: identity_of(&fresh, cluster),
            created: true,
        });
    }
    let found = match answer.responses.first() {
        Some(ResponseOp::Range(range)) => range
            .kvs
            .first()
            .and_then(|kv| kv.value.text())
            .map(str::to_owned),
        _ => None,
    };
    match found {
        Some(record) if !record.is_empty() && !record.contains('@') => Ok(StoreIdentity {
            id: identity_of(&record, cluster),
            created: false,
        }),
        other => Err(unexpected(
            format!(
                "the store identity record {} is unreadable",
                keys.store_id()
            ) + &other.map(|r| format!(": {r:?}")).unwrap_or_default(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_joins_the_record_and_the_cluster() {
        let id = identity_of("abc", 0x1234);
        assert_eq!(id, "abc@0000000000001234");
        assert_eq!(record_of(&id), "abc");
        assert_eq!(cluster_of(&id), Some(0x1234));
        assert_eq!(record_of("plain"), "plain");
        assert_eq!(cluster_of("plain"), None);
    }
}
