//! The fence check: reading a token from a request and deciding, with the store, whether the
//! request may pass (DESIGN §2). `token.rs` parses; `layer.rs` is the tower layer on the hot path.

mod layer;
mod token;

pub use layer::{Admitted, Fence, FenceLayer};
pub use token::{parse_fence_token, read_fence_header, TokenError};
