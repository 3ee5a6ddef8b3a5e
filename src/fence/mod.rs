//! The fence check: reading a token from a request and deciding, with the store, whether the
//! request may pass (docs/design.md §2). `token.rs` parses; `signature.rs` checks the lock
//! authority's signature; `limit.rs` refuses tokens too far ahead of the mark (`max_advance`);
//! `advance.rs` makes a write's compare-and-advance for whichever layer owns it; `layer.rs` is
//! the tower layer on the hot path.

mod advance;
mod layer;
mod limit;
mod signature;
mod token;

pub use advance::{advance, bounded, judge, make_advance, refuse_stale, Bounded};
pub use layer::{Fence, FenceLayer};
pub use limit::{check_max_advance, within_max_advance};
pub use signature::{
    sign_token, signature_key_from_env, signed_message, SignatureConfigError, SignatureError,
    SignatureKey,
};
pub use token::{parse_fence_token, read_fence_header, TokenError};
