//! What the gateway keeps around whichever backend it opened: the lower-bound mark cache,
//! `CheckedStore` in front of the backend, `Measured` timing the backend's calls, the trust flag, the adopted store identity (and its
//! record on disk) and this replica's name as a holder of key turns.

pub mod adoption;
pub(super) mod cache;
pub(super) mod checked;
pub(super) mod expected;
pub(super) mod measured;
pub(super) mod replica;
pub(super) mod trust;
