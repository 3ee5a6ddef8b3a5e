//! The fence check: reading a token from a request and deciding, with the store, whether the
//! request may pass (docs/design.md §2). Tokens and their signatures are read by `crate::token`
//! (re-exported here); `limit.rs` refuses tokens too far ahead of the mark (`max_advance`);
//! `advance.rs` makes a write's compare-and-advance for whichever layer owns it; `authority.rs`
//! consults the route's lock authority; `layer.rs` is the tower layer on the hot path.

mod advance;
mod authority;
mod layer;
mod limit;

pub use advance::{
    advance, bounded, judge, make_advance, refuse_stale, store_answer, store_call, store_failed,
    Bounded,
};
pub use authority::{check_authority, StoreMarks};
pub use layer::{Fence, FenceLayer};
pub use limit::{check_max_advance, within_max_advance};
