//! The fence check: reading a token from a request and deciding, with the store, whether the
//! request may pass (docs/design.md §2). Tokens and their signatures are read by `crate::token`
//! (re-exported here); `limit.rs` refuses tokens too far ahead of the mark (`max_advance`);
//! `store_step.rs` is the one door of a fenced write's store step, whichever layer owns it
//! (read it to see what happens to a fenced write at the store); `authority.rs`
//! consults the route's lock authority; `layer.rs` is the tower layer on the hot path.

mod authority;
mod layer;
mod limit;
mod store_step;

pub use authority::{check_authority, StoreMarks};
pub use layer::{Fence, FenceLayer};
pub use limit::{check_max_advance, within_max_advance};
pub use store_step::{store_call, store_failed, Bounded, FencedWrite};
