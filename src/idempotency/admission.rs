//! The compare-and-advance the fence deferred on an idempotent route (`DeferredAdvance`), made
//! here together with beginning the intent: in one store round where the backend has one
//! (`FenceStore::advance_and_begin`), else the advance and then the begin, as before.

use crate::error::GatewayError;
use crate::fence::{judge_advance, Admitted, DeferredAdvance};
use crate::route::CompiledRoute;
use crate::store::{BeginRequest, Begun, FenceStore, IntentStore, StoreError};

/// The intent store of an idempotent route, and whether it is the fence store's own backend
/// (only then may one store round carry both the advance and the begin).
#[derive(Clone)]
pub struct IntentBackend {
    pub intents: std::sync::Arc<dyn IntentStore>,
    pub fences: std::sync::Arc<dyn FenceStore>,
    pub shared: bool,
}

/// What beginning the intent of an admitted request answered.
pub(super) type BeginAnswer = Result<Result<Begun, StoreError>, GatewayError>;

/// Advances the deferred token and, once it is accepted, begins `begin`. A refused advance is
/// the request's answer (`Err`, counted as the fence counts it); otherwise the admission, for
/// the ordering gate, and the begin's own answer. `begin_in_turn` makes the begin when the
/// backend cannot fold it into the advance.
pub(super) async fn advance_and_begin<F>(
    route: &CompiledRoute,
    deferred: DeferredAdvance,
    backend: &IntentBackend,
    begin: BeginRequest,
    begin_in_turn: impl FnOnce(BeginRequest) -> F,
) -> Result<(Admitted, BeginAnswer), GatewayError>
where
    F: std::future::Future<Output = BeginAnswer>,
{
    let DeferredAdvance { key, token } = deferred;
    let compare = route.fence.compare;
    let timeout = route.fence.store_timeout;
    let begin = if backend.shared {
        match backend
            .fences
            .advance_and_begin(&key, token, compare, begin)
        {
            Ok(call) => {
                let answered = tokio::time::timeout(timeout, call).await;
                let (advanced, begun) = match answered {
                    Ok(Ok(answer)) => (Ok(Ok(answer.advance)), answer.begun),
                    Ok(Err(source)) => (Ok(Err(source)), None),
                    Err(elapsed) => (Err(elapsed), None),
                };
                let key = judge_advance(route, key, token, advanced)?;
                let begun = begun.ok_or(GatewayError::Internal(
                    "an accepted advance came back without its intent",
                ))?;
                return Ok((Admitted { key, token }, Ok(begun)));
            }
            Err(begin) => *begin,
        }
    } else {
        begin
    };
    let advanced =
        tokio::time::timeout(timeout, backend.fences.advance(&key, token, compare)).await;
    let key = judge_advance(route, key, token, advanced)?;
    Ok((Admitted { key, token }, begin_in_turn(begin).await))
}
