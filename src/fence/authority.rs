//! The fence's use of a route's lock authority: the check a fenced write passes before its
//! advance, and the store the authority raises marks in.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::authority::{Authorities, AuthorityRefusal, MarkRaiser};
use crate::config::Compare;
use crate::error::{GatewayError, RequestError};
use crate::guard::CheckedStore;
use crate::proxy::extensions::Admission;
use crate::route::CompiledRoute;
use crate::route::RouteCounters;

/// How long one mark raise of the authority may wait for the store.
const RAISE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks `admission` against the route's lock authority, if it has one. A route with an
/// authority on a gateway that follows none (a layer built without one) refuses: it cannot know.
pub async fn check_authority(
    route: &CompiledRoute,
    admission: &Admission,
    authorities: Option<&Authorities>,
) -> Result<(), RequestError> {
    let Some(settings) = &route.fence.authority else {
        return Ok(());
    };
    let Some(authorities) = authorities else {
        return Err(GatewayError::AuthorityUnavailable {
            detail: "this gateway follows no lock service".to_owned(),
        }
        .for_key(admission.key.as_str()));
    };
    let authority = authorities.get(&route.name, settings, route.fence.compare);
    match authority.check(&admission.key, admission.token).await {
        Ok(_) => Ok(()),
        Err(AuthorityRefusal::LeaseEnded { holder }) => {
            RouteCounters::bump(&route.counters().lease_ended);
            Err(GatewayError::LeaseEnded {
                token: admission.token,
                holder,
            }
            .for_key(admission.key.as_str()))
        }
        Err(AuthorityRefusal::Unavailable { detail }) => {
            Err(GatewayError::AuthorityUnavailable { detail }.for_key(admission.key.as_str()))
        }
    }
}

/// The gateway's store, as the authority raises marks in it.
pub struct StoreMarks(pub Arc<CheckedStore>);

impl MarkRaiser for StoreMarks {
    fn raise<'a>(&'a self, resource: &'a str, mark: u64) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            match tokio::time::timeout(
                RAISE_TIMEOUT,
                self.0.advance(resource, mark, Compare::Monotonic),
            )
            .await
            {
                // Raised, or already higher: either way the mark refuses what it must.
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("key {resource}: {e}")),
                Err(_) => Err(format!("key {resource}: the store did not answer")),
            }
        })
    }
}
