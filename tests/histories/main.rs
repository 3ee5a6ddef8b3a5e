//! Serialized keys across replicas, and faults: the I4 history checker (three gateway processes
//! on one PostgreSQL schema or Redis prefix, with a real lease table), turn leases that a lost
//! store connection does not end, the ordering gate's lock on PostgreSQL, and the fault matrix
//! (store, upstream and `kill -9` faults on every backend, each cell checking I1, I2, I5 and I7),
//! and zombies of an etcd lock, a PostgreSQL lease and a ZooKeeper lock with and without the
//! gateway following the lock service.
//!
//! One test binary for all of them: each links the whole crate. Every test has a
//! schema or key prefix of its own and picks free ports. `serialized_history` opens the most
//! PostgreSQL connections of any test (about 35 for one of its tests, three processes and its
//! lease pool), so the other many-connection test, `replicas`, is in the `process` binary: two
//! tests of one binary run at once, and `cargo test` runs one binary at a time.

#[path = "../support/mod.rs"]
mod support;

mod fault_matrix;
mod lease_zombies;
mod ordering_postgres;
mod serialized_history;
mod turn_leases;
