//! The one way a failure becomes a problem document and the one header it adds, for the data
//! plane's refusals and the admin API's failures alike: the kind's row of the table, the detail,
//! and the facts the failure knows (route, key, tokens, how long to wait, what is allowed).

use http::{header, HeaderName, HeaderValue};

use super::kind::{ErrorKind, Retry};
use super::problem::Problem;

/// Seconds a client should wait before retrying a failure of kind [`Retry::Soon`].
const RETRY_SOON_SECS: &str = "1";

/// Header naming the key's high-water mark on a stale-fence refusal.
pub const X_FENCE_CURRENT: HeaderName = HeaderName::from_static("x-fence-current");

/// What a failure knows besides its kind and detail; each is left out of the answer when absent.
#[derive(Debug, Default)]
pub struct Facts {
    pub route: Option<String>,
    pub key: Option<String>,
    /// The request's token.
    pub fence: Option<u64>,
    /// The key's mark (or the lock's holder).
    pub current_fence: Option<u64>,
    pub max_advance: Option<u64>,
    /// Whether the mark is also sent as `X-Fence-Current` (the refusals a client can act on by
    /// taking a newer token).
    pub fence_header: bool,
    /// `Retry-After` for a kind that takes it from the failure ([`Retry::After`]).
    pub retry_after_secs: Option<u64>,
    /// `Allow` for a method the endpoint does not take.
    pub allow: Option<&'static str>,
}

/// The problem document and the one header it adds, if any: `Allow`, else `X-Fence-Current`,
/// else the kind's `Retry-After`.
#[inline]
pub fn answer(
    kind: ErrorKind,
    detail: String,
    facts: Facts,
) -> (Problem, Option<(HeaderName, HeaderValue)>) {
    let mut problem = kind.problem(detail);
    problem.key = facts.key;
    problem.route = facts.route;
    problem.fence = facts.fence;
    problem.current_fence = facts.current_fence;
    problem.max_advance = facts.max_advance;
    // Only the header sent is made.
    let extra = if let Some(allow) = facts.allow {
        Some((header::ALLOW, HeaderValue::from_static(allow)))
    } else if let (true, Some(current)) = (facts.fence_header, facts.current_fence) {
        Some((X_FENCE_CURRENT, HeaderValue::from(current)))
    } else {
        let retry = match kind.spec().retry {
            Retry::No => None,
            Retry::Soon => Some(HeaderValue::from_static(RETRY_SOON_SECS)),
            Retry::After => facts.retry_after_secs.map(HeaderValue::from),
        };
        retry.map(|value| (header::RETRY_AFTER, value))
    };
    (problem, extra)
}
