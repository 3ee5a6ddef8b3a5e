//! Fencing tokens as a request carries them: parsing the token header, and the lock authority's
//! signature over a key and token. A leaf: the fence layer and the claim endpoint read tokens
//! through it, and their refusals are plain data that the error module answers.

mod parse;
mod signature;

pub use parse::{parse_fence_token, read_fence_header, TokenError};
pub use signature::{
    sign_token, signature_key_from, signed_message, SignatureConfigError, SignatureError,
    SignatureKey,
};
