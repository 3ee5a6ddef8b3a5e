//! The compare-and-advance of an idempotent route's write, which routing gives to this layer
//! (`AdvanceBy::Intent`), made together with beginning the intent: in one store round where the backend has one
//! (`CheckedStore::advance_and_begin`), else the advance and then the begin, as before.

use crate::error::GatewayError;
use crate::extensions::Admission;
use crate::fence::{advance, make_advance, store_answer};
use crate::guard::CheckedStore;
use crate::route::CompiledRoute;
use crate::store::{BeginRequest, Begun, IntentStore};

/// The intent store of idempotent routes, and the fence store, which folds a write's advance and
/// its begin into one round where its backend has one.
#[derive(Clone)]
pub struct IntentBackend {
    pub intents: std::sync::Arc<dyn IntentStore>,
    pub fences: std::sync::Arc<CheckedStore>,
}

/// What beginning the intent of an admitted request answered.
pub(super) type BeginAnswer = Result<Begun, GatewayError>;

/// Makes the advance of `admission`, which routing left to this layer, and once it is accepted
/// begins `begin`. A refused advance is the request's answer (`Err`, judged and counted in
/// `fence::make_advance`); otherwise the begin's own answer. `begin_in_turn` makes the begin when
/// the backend cannot fold it into the advance.
pub(super) async fn advance_and_begin<F>(
    route: &CompiledRoute,
    admission: &Admission,
    backend: &IntentBackend,
    begin: BeginRequest,
    begin_in_turn: impl FnOnce(BeginRequest) -> F,
) -> BeginAnswer
where
    F: std::future::Future<Output = BeginAnswer>,
{
    let compare = route.fence.compare;
    let (key, token) = (&admission.key, admission.token);
    let record_key = begin.key.clone();
    let begin = match backend.fences.advance_and_begin(key, token, compare, begin) {
        Ok(call) => {
            let step = async {
                let answer = call.await?;
                Ok((answer.advance, answer.begun))
            };
            let begun = make_advance(route, admission, step).await?;
            let begun = begun.ok_or(GatewayError::Internal(
                "an accepted advance came back without its intent",
            ))?;
            // The intent's begin failed after the advance was made: the store failed.
            return store_answer(&record_key, route.fence.store_timeout, Ok(begun));
        }
        Err(begin) => *begin,
    };
    advance(route, admission, backend.fences.as_ref()).await?;
    begin_in_turn(begin).await
}
