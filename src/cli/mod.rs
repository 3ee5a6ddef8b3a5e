//! What only the command line uses, kept in the binary rather than the library: the client of a
//! running gateway's admin listener (`admin_client.rs`, for `fencegate health` and remote
//! `fencegate intents`) and intent reconciliation from the command line (`intents.rs`).

pub mod admin_client;
pub mod intents;
