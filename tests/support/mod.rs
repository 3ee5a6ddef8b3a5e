//! Shared helpers for the integration tests: a recording upstream, an in-process gateway, the real
//! binary as a child process, and a small HTTP client.
#![allow(dead_code, unused_imports)] // each test crate uses a different subset

pub mod admin_api;
pub mod attack;
pub mod cell_clients;
pub mod cell_gateway;
pub mod cell_store;
pub mod client;
pub mod contract;
pub mod counting_upstream;
pub mod etcd;
pub mod fault_checks;
pub mod fault_upstream;
pub mod frameworks;
pub mod gateway;
pub mod history;
pub mod hyper_peer;
pub mod intent_contract;
pub mod leases;
pub mod locks;
pub mod namespace_in_task;
pub mod network_store;
pub mod ordering;
pub mod outcome;
pub mod payments;
pub mod postgres;
pub mod process;
pub mod promtool;
pub mod provider;
pub mod raw;
pub mod redis;
pub mod relay;
pub mod store_tls;
pub mod stripe;
pub mod tls;
pub mod upstream;
pub mod wire;
pub mod zookeeper;

pub use client::{send, send_h2, Reply};
pub use gateway::TestGateway;
pub use process::GatewayProcess;
pub use upstream::{Abandoned, Behavior, RecordingUpstream, Seen, DELAY_HEADER};
