//! The real `fencegate` binary as a child process: the command line, durability across restarts
//! and `kill -9`, SIGTERM and SIGHUP, log lines, idempotency across a crash, hostile load under
//! `prlimit` limits, three replicas on one PostgreSQL schema or Redis prefix (the I1 history
//! check across processes), and the official Stripe Python library through the binary to a fake
//! provider (each payout charged once across retries, duplicates and a `kill -9`), and the
//! lock clients of docs/getting-tokens.md (etcd, a PostgreSQL lease table) writing through it.
//!
//! One test binary for all of them: each links the whole crate. The resource limits
//! (`prlimit --as`, `--nofile`) are set on the child only, never on this process, and the memory
//! checks read the child's `/proc/PID/status`, so they do not depend on what else runs here.
//! `replicas` is here, not with `serialized_history` in `histories`: each opens 25 to 35
//! PostgreSQL connections, and the other tests here open a few at most.

#[path = "../support/mod.rs"]
mod support;

mod admin_client;
mod admin_openapi;
mod cli;
mod deploy;
mod durability;
mod hostile_load;
mod idempotency_crash;
mod log_escaping;
mod payment_sdks;
mod provider_contracts;
mod reload;
mod replicas;
mod rolling_restart;
mod shutdown;
mod stripe;
mod telemetry;
mod token_snippets;
mod upstream_auth;
mod walkthrough;
