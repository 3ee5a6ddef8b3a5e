//! Plumbing more than one backend uses: the per-thread task handles, the inbox every batching task
//! takes its commands from, the request/reply mailbox, flat combining, the batching loop, the SQL
//! backends' intent row and the URL redactor. Nothing here knows a backend's schema or wire format.

//!
//! The network backends' plumbing is compiled only with one of them (Cargo features); with some
//! of them left out, the parts only those use are left unused.

#[cfg(any(feature = "postgres", feature = "redis", feature = "etcd"))]
#[cfg_attr(
    not(all(feature = "postgres", feature = "redis", feature = "etcd")),
    allow(dead_code)
)]
pub(super) mod batches;
pub(super) mod combining;
#[cfg(any(feature = "postgres", feature = "redis", feature = "etcd"))]
#[cfg_attr(
    not(all(feature = "postgres", feature = "redis", feature = "etcd")),
    allow(dead_code)
)]
pub(super) mod inbox;
pub(super) mod intent_rows;
#[cfg(any(feature = "postgres", feature = "redis", feature = "etcd"))]
#[cfg_attr(
    not(all(feature = "postgres", feature = "redis", feature = "etcd")),
    allow(dead_code)
)]
pub(super) mod mailbox;
#[cfg(any(feature = "postgres", feature = "redis", feature = "etcd"))]
pub(super) mod per_thread;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(super) mod redact;
