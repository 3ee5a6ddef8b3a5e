//! The stores, backend by backend (embedded, PostgreSQL at 127.0.0.1:5432, Redis at
//! 127.0.0.1:6379): their contracts, the cross-replica gate driven directly, idempotency and
//! waiting claims on each backend, and stores that fail, forget or are wiped.
//!
//! One test binary for all of them: each links the whole crate. Every test works in a
//! PostgreSQL schema or Redis key prefix of its own (`support::postgres::unique_schema`,
//! `support::redis::unique_prefix`) and removes only that, so tests of different modules never
//! reset each other's data when they run at once.

#[path = "../support/mod.rs"]
mod support;

mod authority;
mod authority_zookeeper;
mod claim_waits;
mod etcd_access;
mod fail_closed;
mod idempotency;
mod shared_gate;
mod store_contract;
mod store_contract_etcd;
mod store_contract_postgres;
mod store_contract_redis;
mod store_identity;
mod store_wipe;
mod tls;
