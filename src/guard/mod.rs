//! What the gateway keeps around whichever store backend it opened: `CheckedStore` in front of
//! the backend (the lower-bound mark cache, the trust flag), `Measured` timing the backend's
//! calls, the adopted store identity (and its record on disk) and this replica's name as a holder
//! of key turns. The backends (`crate::store`) know none of it.

pub mod adoption;
mod cache;
mod checked;
mod measured;
mod replica;
mod trust;

pub use cache::MarkCache;
pub use checked::{AdvanceMade, CheckedStore};
pub use measured::Measured;
pub use replica::Replica;
pub use trust::StoreTrust;
