//! The compare-and-advance of an idempotent route's write, which the route leaves to this layer
//! (`AdvanceBy::Intent`), made together with beginning the intent: in one store round where the
//! backend has one (`CheckedStore::advance_and_begin`), else the advance and then the begin.

use crate::error::{GatewayError, RequestError};
use crate::fence::{store_failed, FencedWrite};
use crate::guard::CheckedStore;
use crate::proxy::extensions::Admission;
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
pub(super) type BeginAnswer = Result<Begun, RequestError>;

/// Makes the advance of `admission`, which its route leaves to this layer, and once it is
/// accepted begins `begin`. A refused advance is the request's answer (`Err`, judged and counted
/// by `fence::FencedWrite`); otherwise the begin's own answer. `begin_in_turn` makes the begin
/// when the backend cannot fold it into the advance.
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
    let write = FencedWrite::on_route(route, admission);
    let record_key = begin.key.clone();
    let begin = match backend
        .fences
        .advance_and_begin(write.key, write.token, write.compare, begin)
    {
        Ok(call) => {
            let step = async {
                let answer = call.await?;
                Ok((answer.advance, answer.begun))
            };
            let begun = write.advance_with(step).await?.ok_or_else(|| {
                GatewayError::Internal("an accepted advance came back without its intent")
                    .for_key(record_key.as_str())
            })?;
            // The intent's begin failed after the advance was made: the store failed.
            return begun.map_err(|source| store_failed(&record_key, source));
        }
        Err(begin) => *begin,
    };
    write.advance(backend.fences.as_ref()).await?;
    begin_in_turn(begin).await
}
