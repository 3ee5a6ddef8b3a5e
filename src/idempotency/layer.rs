//! `IdempotencyLayer` → `Idempotency<S>`: after the fence (a superseded holder was refused already)
//! and before the ordering gate. Records the intent durably, forwards with the key, records the
//! outcome before answering; replays known outcomes; refuses duplicates in flight (409), repeats
//! of an unknown outcome on a route that holds them (409), keys reused for other requests (422)
//! and requests without a required client key (400).

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use tower::{Layer, Service};

use super::admission::{advance_and_begin, IntentBackend};
use super::inject::{client_key_in_body, inject_json};
use super::{decode_client_key, encode_key, fingerprint, idempotency_key, now_ms};
use crate::body::budget::{Budgeted, MemoryBudget};
use crate::body::{full_body, ProxyBody, RequestBody};
use crate::config::{ClientKey, UnknownOutcome, WhenMissing};
use crate::error::{GatewayError, RequestError};
use crate::fence::{store_call, FencedWrite};
use crate::proxy::extensions::{Admission, GatewayReplay};
use crate::proxy::{
    read_prefix, read_request, Prefix, Prefixed, ProxyFuture, ReadFailure, StackService,
};
use crate::route::IdempotencySettings;
use crate::route::RouteCounters;
use crate::route::{AdvanceBy, CompiledRoute, Inject, RenderError, RequestParts, RouteMatch};
use crate::store::{BeginRequest, Begun, IntentStore, Resolution, StoredOutcome};
use crate::telemetry::{AccessNote, Verdict};

/// Header marking an answer replayed from a stored outcome.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Added to the route's timeout to make an attempt's lease: a gateway that died mid-call blocks
/// retries of that intent for at most this long after the call would have timed out.
const ATTEMPT_LEASE_MARGIN: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct IdempotencyLayer {
    backend: IntentBackend,
    budget: MemoryBudget,
}

impl IdempotencyLayer {
    /// Bodies read whole, and responses captured, are held under `budget`.
    pub fn new(backend: IntentBackend, budget: MemoryBudget) -> IdempotencyLayer {
        IdempotencyLayer { backend, budget }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            backend: self.backend.clone(),
            budget: self.budget.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Idempotency<S> {
    backend: IntentBackend,
    budget: MemoryBudget,
    inner: S,
}

impl<S> Service<Request<RequestBody>> for Idempotency<S>
where
    S: StackService,
{
    type Response = Response<ProxyBody>;
    type Error = RequestError;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let routed = match request.extensions().get::<RouteMatch>() {
            Some(routed)
                if routed.route.idempotency.is_some()
                    && routed.route.fenced_methods.contains(request.method()) =>
            {
                routed.clone()
            }
            // Not an idempotent write: the inner service's own future, not another box.
            _ => return self.inner.call(request),
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let backend = self.backend.clone();
        let budget = self.budget.clone();
        Box::pin(async move { call_once(request, &routed, &backend, &budget, &mut inner).await })
    }
}

/// The flow for one request on an idempotent route.
async fn call_once<S>(
    request: Request<RequestBody>,
    routed: &RouteMatch,
    backend: &IntentBackend,
    budget: &MemoryBudget,
    inner: &mut S,
) -> Result<Response<ProxyBody>, RequestError>
where
    S: Service<Request<RequestBody>, Response = Response<ProxyBody>, Error = RequestError>,
{
    let route = routed.route.as_ref();
    let Some(settings) = &route.idempotency else {
        return inner.call(request).await;
    };
    let intents = backend.intents.as_ref();
    let admission = request.extensions().get::<Admission>().cloned();
    let owes_advance = route.advance_by() == AdvanceBy::Intent;
    let (mut parts, body) = request.into_parts();
    let (body, request_held) = read_request(body, settings.max_request_body, budget)
        .await
        .map_err(|failure| match failure {
            // Past the route's `max_body` (counted by the body itself): 413, not 400.
            ReadFailure::Body(e) if crate::body::is_body_limit_exceeded(e.as_ref()) => {
                GatewayError::BodyTooLarge {
                    limit: route.max_body,
                }
            }
            ReadFailure::Body(e) => {
                crate::proxy::client_body_fault(e.as_ref()).unwrap_or(GatewayError::ClientBody)
            }
            ReadFailure::Busy(busy) => GatewayError::MemoryBusy { after: busy.wait },
        })?
        .ok_or(GatewayError::BodyTooLarge {
            limit: settings.max_request_body,
        })?;
    let sent_key = match key_for(&parts, &body, route, routed, settings) {
        Ok(key) => key,
        Err(GatewayError::KeyUnavailable { error }) if error.is_missing_input() => {
            match settings.when_missing {
                WhenMissing::Refuse => return Err(GatewayError::KeyUnavailable { error }.into()),
                WhenMissing::Passthrough => {
                    // Not keyed, not recorded; but a write whose route leaves its advance to this
                    // layer is fenced here all the same.
                    if let Some(admission) = admission.as_ref().filter(|_| owes_advance) {
                        FencedWrite::on_route(route, admission)
                            .advance(backend.fences.as_ref())
                            .await?;
                    }
                    return inner
                        .call(Request::from_parts(parts, RequestBody::full(body)))
                        .await;
                }
                WhenMissing::ClientKey => match client_key_of(&parts.headers, &body, settings)? {
                    Some(client) => within_limit(client, settings)?,
                    None => return Err(GatewayError::KeyUnavailable { error }.into()),
                },
            }
        }
        Err(error) => return Err(error.into()),
    };
    let record_key = format!("{}/{sent_key}", route.name);
    let fence = admission.as_ref().map_or(0, |admission| admission.token);
    // Where the provider wants the key in the body, the body it is sent with, checked before
    // anything is recorded. The fingerprint is taken over it: a client's own key replaced in it
    // must not make two attempts at one operation differ.
    let injected = match &settings.inject {
        Inject::Header => None,
        Inject::Json(pointer) => Some(
            inject_json(
                &body,
                pointer,
                &sent_key,
                settings.client_key == ClientKey::Replace,
            )
            .map_err(|error| GatewayError::KeyUnavailable { error })?,
        ),
    };
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let now = now_ms();
    let attempt = uuid::Uuid::new_v4().to_string();
    let lease = route.timeout + ATTEMPT_LEASE_MARGIN;
    let begin = BeginRequest {
        key: record_key.clone(),
        route: route.name.clone(),
        fence,
        fingerprint: fingerprint(
            parts.method.as_str(),
            path,
            injected.as_ref().unwrap_or(&body),
        ),
        attempt: attempt.clone(),
        attempt_expires_ms: now + u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        now_ms: now,
        expires_ms: now + u64::try_from(settings.retention.as_millis()).unwrap_or(u64::MAX),
    };
    let timeout = route.fence.store_timeout;
    let begun = match admission.filter(|_| owes_advance) {
        // The route leaves the compare-and-advance to this layer: made now, with the begin.
        Some(admission) => {
            advance_and_begin(route, &admission, backend, begin, |begin| {
                store_call(&record_key, timeout, intents.begin(begin))
            })
            .await?
        }
        None => store_call(&record_key, timeout, intents.begin(begin)).await?,
    };
    let fresh = match begun {
        Begun::Fresh => true,
        Begun::Resubmit { .. } if settings.on_unknown_outcome == UnknownOutcome::Hold => {
            // The store handed this attempt the intent; give it back untouched, still SUBMITTING
            // and listed for reconciliation, and send nothing.
            let _ = intents.abandon(&record_key, &attempt, now_ms()).await;
            return Err(GatewayError::OutcomeUnknown { key: sent_key }.into());
        }
        Begun::Resubmit { .. } => false,
        Begun::Completed(outcome) => {
            if let Some(note) = parts.extensions.get::<AccessNote>() {
                note.verdict(Verdict::Replayed);
            }
            return Ok(replay(outcome));
        }
        Begun::InFlight { retry_after_ms } => {
            return Err(GatewayError::RequestInProgress {
                key: sent_key,
                retry_after_secs: retry_after_ms.div_ceil(1000).max(1),
            }
            .into())
        }
        Begun::Mismatch => return Err(GatewayError::IdempotencyKeyReused { key: sent_key }.into()),
        Begun::Superseded { fence: current } => {
            return Err(GatewayError::StaleFence {
                token: fence,
                current,
            }
            .for_key(record_key))
        }
    };
    let sent_body = match injected {
        Some(injected) => {
            parts.headers.remove(http::header::TRANSFER_ENCODING);
            parts.headers.insert(
                http::header::CONTENT_LENGTH,
                HeaderValue::from(injected.len()),
            );
            injected
        }
        None => {
            let value = HeaderValue::from_str(&encode_key(&sent_key, settings.key_encoding))
                .map_err(|_| GatewayError::Internal("idempotency key is not a header value"))?;
            parts.headers.insert(settings.header.clone(), value);
            body
        }
    };
    let forwarded = inner
        .call(Request::from_parts(parts, RequestBody::full(sent_body)))
        .await;
    let response = match forwarded {
        Ok(response) if settings.is_transient(response.status()) => {
            // The provider did nothing (rate limited, busy, the key in use): no outcome to keep,
            // and the answer goes to the client as it came, `Retry-After` included.
            let_go(intents, &record_key, &attempt, fresh).await;
            RouteCounters::bump(&route.counters().transient_answers);
            tracing::info!(route = %route.name, key = %record_key, status = response.status().as_u16(), "transient answer: the intent is released, not recorded");
            return Ok(response);
        }
        Ok(response) if !response.status().is_server_error() => {
            if response
                .headers()
                .contains_key(&settings.provider_replay_header)
            {
                // The provider answered from its own record of the key: passed on as it came,
                // and counted as the provider's replay, not the gateway's.
                RouteCounters::bump(&route.counters().provider_replays);
            }
            response
        }
        Err(error) if fresh && error.never_reached_upstream() => {
            // Certainly not sent (refused, no TLS, no free connection, no turn): nothing happened
            // at the provider, so the intent is forgotten and a retry submits afresh. A
            // re-submission keeps its intent: the earlier attempt's outcome is still unknown.
            let _ = intents
                .resolve(&record_key, Resolution::Release, now_ms())
                .await;
            return Err(error);
        }
        other => {
            // Timed out, reset, or a 5xx: the outcome is unknown. The intent stays SUBMITTING
            // (listed for reconciliation); the next attempt re-submits the same key, or is
            // refused on a route that holds unknown outcomes.
            let _ = intents.abandon(&record_key, &attempt, now_ms()).await;
            return other;
        }
    };
    let (head, body) = response.into_parts();
    // The request's bytes were sent; the capture is held under the budget from here on.
    drop(request_held);
    let mut held = budget.empty();
    let prefix = read_prefix(body, settings.max_stored_body, budget, &mut held).await;
    let (stored_body, complete, reply_body) = match prefix {
        // The stored body and the client's are the same bytes, not copies.
        Ok(Prefix::Whole(bytes)) => (
            bytes.clone(),
            true,
            Budgeted::new(full_body(bytes), held).boxed(),
        ),
        Ok(Prefix::Longer { read, rest }) => (
            Bytes::new(),
            false,
            Budgeted::new(Prefixed::new(read, rest), held).boxed(),
        ),
        Err(_) => {
            let _ = intents.abandon(&record_key, &attempt, now_ms()).await;
            return Err(GatewayError::UpstreamBodyFailed.into());
        }
    };
    if let Some(rule) = &settings.completed_when {
        // An answer too long to read whole cannot be shown to say "completed" either.
        if !(complete && rule.holds(&stored_body)) {
            let_go(intents, &record_key, &attempt, fresh).await;
            RouteCounters::bump(&route.counters().transient_answers);
            tracing::info!(route = %route.name, key = %record_key, status = head.status.as_u16(), "the answer's body does not say completed (completed_when): the intent is released, not recorded");
            return Ok(Response::from_parts(head, reply_body));
        }
    }
    let outcome = StoredOutcome {
        status: head.status.as_u16(),
        headers: settings
            .stored_headers
            .iter()
            .filter_map(|name| {
                let value = head.headers.get(name)?.to_str().ok()?;
                Some((name.as_str().to_owned(), value.to_owned()))
            })
            .collect(),
        body: stored_body,
        body_complete: complete,
    };
    // Recorded before the client sees the answer, so a retry right after it finds the outcome.
    let recorded = store_call(
        &record_key,
        route.fence.store_timeout,
        intents.complete(&record_key, outcome, now_ms()),
    )
    .await;
    if let Err(error) = recorded {
        tracing::warn!(route = %route.name, key = %record_key, %error, "recording an outcome failed; the intent stays SUBMITTING");
    }
    Ok(Response::from_parts(head, reply_body))
}

/// The key to send: derived from the template, or the client's, per the route's `client_key`.
fn key_for(
    request: &http::request::Parts,
    body: &[u8],
    route: &CompiledRoute,
    routed: &RouteMatch,
    settings: &IdempotencySettings,
) -> Result<String, GatewayError> {
    let client = client_key_of(&request.headers, body, settings)?;
    match (settings.client_key, &client) {
        (ClientKey::Keep | ClientKey::Require, Some(client)) => {
            return within_limit(client.clone(), settings)
        }
        (ClientKey::Require, None) => {
            return Err(GatewayError::IdempotencyKeyRequired {
                place: key_place(settings),
            })
        }
        _ => {}
    }
    // The fence's key; where the fence admitted nothing (an observed refusal forwards without
    // one), the same key rendered here, so that two resources never share an idempotency key.
    let rendered_key;
    let resource_key = match (request.extensions.get::<Admission>(), &route.resource_key) {
        (Some(admission), _) => admission.key.as_str(),
        (None, Some(template)) => {
            rendered_key = template
                .render(&RequestParts {
                    captures: &routed.captures,
                    headers: &request.headers,
                    query: request.uri.query(),
                    body: None,
                })
                .map_err(|error| GatewayError::KeyUnavailable { error })?;
            rendered_key.as_str()
        }
        (None, None) => "",
    };
    let captures = routed.captures.with(&[
        ("resource_key", resource_key),
        ("method", request.method.as_str()),
        ("route", route.name.as_str()),
    ]);
    let parts = RequestParts {
        captures: &captures,
        headers: &request.headers,
        query: request.uri.query(),
        body: Some(body),
    };
    let rendered = settings
        .key
        .render(&parts)
        .map_err(|error| GatewayError::KeyUnavailable { error })?;
    let derived = within_limit(
        idempotency_key(
            &rendered,
            settings.hmac_secret.as_deref(),
            settings.key_format,
            settings.max_key_length,
        ),
        settings,
    )?;
    match client {
        Some(client) if settings.client_key == ClientKey::Refuse && client != derived => {
            Err(GatewayError::KeyUnavailable {
                error: RenderError::ClientKeyRefused(key_place(settings)),
            })
        }
        _ => Ok(derived),
    }
}

/// Where the route's key goes, as a client reads it in an error.
fn key_place(settings: &IdempotencySettings) -> String {
    match &settings.inject {
        Inject::Header => format!("the {} header", settings.header),
        Inject::Json(pointer) => format!("the JSON body at {pointer}"),
    }
}

/// Lets go of an attempt whose answer is not an outcome (the provider did nothing): a fresh
/// intent is released, so the next attempt goes to the provider; a re-submission keeps its intent
/// `SUBMITTING`, since the earlier attempt's outcome is still unknown.
async fn let_go(intents: &dyn IntentStore, record_key: &str, attempt: &str, fresh: bool) {
    if fresh {
        let _ = intents
            .resolve(record_key, Resolution::Release, now_ms())
            .await;
    } else {
        let _ = intents.abandon(record_key, attempt, now_ms()).await;
    }
}

/// The key the client sent where the route puts it: in the route's header (unquoted under
/// `sf-string`), or in the JSON body's member.
fn client_key_of(
    headers: &http::HeaderMap,
    body: &[u8],
    settings: &IdempotencySettings,
) -> Result<Option<String>, GatewayError> {
    match &settings.inject {
        Inject::Header => Ok(headers
            .get(&settings.header)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|client| decode_client_key(client, settings.key_encoding))),
        Inject::Json(pointer) => client_key_in_body(body, pointer)
            .map(|key| key.filter(|key| !key.is_empty()))
            .map_err(|error| GatewayError::KeyUnavailable { error }),
    }
}

/// A key longer than the provider takes is refused before anything is recorded (digests were
/// already cut to fit; raw and client keys cannot be).
fn within_limit(key: String, settings: &IdempotencySettings) -> Result<String, GatewayError> {
    match settings.max_key_length {
        Some(max) if key.len() > max => Err(GatewayError::IdempotencyKeyTooLong {
            length: key.len(),
            max,
        }),
        _ => Ok(key),
    }
}

/// The stored answer, marked as a replay.
fn replay(outcome: StoredOutcome) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = if outcome.body_complete {
        outcome.body
    } else {
        Bytes::new()
    };
    let mut response = Response::new(full_body(body));
    *response.status_mut() = status;
    // Framing headers are never recorded now; a record written before that still has them.
    let replayable = outcome
        .headers
        .iter()
        .filter(|(name, _)| crate::route::is_replayable_header(&name.to_ascii_lowercase()));
    for (name, value) in replayable {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response.extensions_mut().insert(GatewayReplay);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_frames_its_own_body_whatever_the_record_holds() {
        // A record written before framing headers were refused: they are not replayed.
        let response = replay(StoredOutcome {
            status: 201,
            headers: vec![
                ("content-type".to_owned(), "text/plain".to_owned()),
                ("Content-Length".to_owned(), "999".to_owned()),
                ("transfer-encoding".to_owned(), "chunked".to_owned()),
            ],
            body: Bytes::from_static(b"hello"),
            body_complete: true,
        });
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()["content-type"], "text/plain");
        assert!(!response.headers().contains_key("content-length"));
        assert!(!response.headers().contains_key("transfer-encoding"));
    }
}
