//! `POST /_fencegate/claim/{resource_key}`: a new lock holder raises its key's mark to its token
//! without writing anything upstream (docs/design.md §5), so a zombie's write that would otherwise
//! arrive before the holder's first write is refused too.
//!
//! On a gateway with serialized routes a claim that raised the mark answers only once every
//! write of the key admitted before it has ended at the upstream (or was refused): its 200 means
//! no older generation reaches the upstream after it. The wait is bounded by the largest
//! `gate_timeout` of those routes, then 503 `gate-timeout`.
//!
//! A claim belongs to no route, so it is held to the strictest token rules of the routes that
//! enforce: when any of them requires signed tokens, a claim needs a signature valid under one of
//! their secrets (in that route's signature header), and the smallest `max_advance` among them
//! applies. Otherwise the claim endpoint would be the way around both defences.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::body::{full_body, ProxyBody};
use crate::config::{Compare, FenceMode, Ordering, DEFAULT_STORE_TIMEOUT};
use crate::error::{GatewayError, RequestError};
use crate::fence::{check_max_advance, store_failed, FencedWrite};
use crate::gate::{CrossReplicaGateError, Gates};
use crate::guard::CheckedStore;
use crate::reload::RouteSource;
use crate::route::{CompiledRoute, RouteTable, MAX_RESOURCE_KEY_LEN, RESERVED_PREFIX};
use crate::telemetry::{AccessNote, Verdict};
use crate::token::{read_fence_header, SignatureError, SignatureKey};

/// The claim endpoint's path below the reserved prefix.
const CLAIM_PATH: &str = "claim/";
/// Claims always read the default fence header (`X-Fence`): they belong to no route.
const CLAIM_FENCE_HEADER: http::HeaderName = http::HeaderName::from_static("x-fence");
/// What claims report as their route in logs and problems.
const CLAIM_ROUTE: &str = "_claim";

#[derive(Clone)]
pub struct Claim {
    store: Arc<CheckedStore>,
    routes: Arc<RouteSource>,
    gates: Gates,
}

#[derive(Serialize)]
struct Claimed<'a> {
    key: &'a str,
    fence: u64,
    previous: Option<u64>,
}

impl Claim {
    pub fn new(store: Arc<CheckedStore>, routes: Arc<RouteSource>, gates: Gates) -> Claim {
        Claim {
            store,
            routes,
            gates,
        }
    }

    /// Answers a request under the reserved prefix. Claims compare monotonically: re-claiming the
    /// token one already holds succeeds, so a client may retry a claim whose answer it lost.
    /// Failures are answered as failures of the route named `_claim`.
    pub async fn handle<B>(
        &self,
        request: Request<B>,
    ) -> Result<Response<ProxyBody>, RequestError> {
        self.claim(request)
            .await
            .map_err(|error| error.on_route(CLAIM_ROUTE))
    }

    async fn claim<B>(&self, request: Request<B>) -> Result<Response<ProxyBody>, RequestError> {
        let path = request.uri().path();
        let Some(raw_key) = path
            .strip_prefix(RESERVED_PREFIX)
            .and_then(|p| p.strip_prefix(CLAIM_PATH))
        else {
            return Err(GatewayError::ReservedNotFound {
                path: path.to_owned(),
            }
            .into());
        };
        if request.method() != Method::POST {
            return Err(GatewayError::MethodNotAllowed { allow: "POST" }.into());
        }
        let key = decode_key(raw_key)?;
        let note = request.extensions().get::<AccessNote>();
        if let Some(note) = note {
            note.route(CLAIM_ROUTE, false);
        }
        let token = match read_fence_header(request.headers(), &CLAIM_FENCE_HEADER) {
            Ok(token) => token,
            Err(error) => return Err(GatewayError::Token { error }.for_key(key)),
        };
        if let Some(note) = note {
            note.key_and_token(&key, token);
            note.verdict(Verdict::Claimed);
        }
        let table = self.routes.current();
        verify_signature(&table, request.headers(), &key, token)?;
        if let Some(max_advance) = enforcing(&table).filter_map(|r| r.fence.max_advance).min() {
            check_max_advance(
                &key,
                token,
                max_advance,
                self.store.as_ref(),
                DEFAULT_STORE_TIMEOUT,
            )
            .await?;
        }
        let write = FencedWrite {
            key: &key,
            token,
            compare: Compare::Monotonic,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            // A claim belongs to no route: it counts in none.
            counters: None,
        };
        let previous = write.advance(self.store.as_ref()).await?;
        self.wait_for_earlier_writes(&table, &key).await?;
        tracing::info!(%key, token, ?previous, "claimed");
        Ok(claimed(&key, token, previous))
    }
}

impl Claim {
    /// With serialized routes, waits until the writes of `key` admitted before the claim have
    /// ended (see the module docs).
    async fn wait_for_earlier_writes(
        &self,
        table: &RouteTable,
        key: &str,
    ) -> Result<(), RequestError> {
        let Some(wait) = table
            .routes()
            .filter(|r| r.fence.ordering == Ordering::Serialize && r.fence.mode != FenceMode::Off)
            .map(|r| r.fence.gate_timeout)
            .max()
        else {
            return Ok(());
        };
        match self.gates.wait_for_turn(key, wait).await {
            Ok(()) => Ok(()),
            Err(CrossReplicaGateError::Timeout(after)) => {
                Err(GatewayError::GateTimeout { after }.for_key(key))
            }
            Err(CrossReplicaGateError::Store(source)) => Err(store_failed(key, source)),
        }
    }
}

/// The routes whose token rules claims inherit.
fn enforcing(table: &RouteTable) -> impl Iterator<Item = &Arc<CompiledRoute>> {
    table
        .routes()
        .filter(|r| r.fence.mode == FenceMode::Enforce)
}

/// Passes when no enforcing route signs tokens, or when one of their keys verifies the claim.
/// Refused as missing only when no signature header of theirs is present at all.
fn verify_signature(
    table: &RouteTable,
    headers: &http::HeaderMap,
    key: &str,
    token: u64,
) -> Result<(), RequestError> {
    let keys: Vec<&SignatureKey> = enforcing(table)
        .filter_map(|r| r.fence.signature.as_ref())
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    let mut refusal = SignatureError::Missing;
    for signature in keys {
        match signature.verify(headers, key, token) {
            Ok(()) => return Ok(()),
            Err(SignatureError::Missing) => {}
            Err(error) => refusal = error,
        }
    }
    Err(GatewayError::Signature { error: refusal }.for_key(key))
}

fn decode_key(raw: &str) -> Result<String, GatewayError> {
    let key = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| GatewayError::BadClaimKey)?;
    if key.is_empty() || key.len() > MAX_RESOURCE_KEY_LEN || key.chars().any(char::is_control) {
        return Err(GatewayError::BadClaimKey);
    }
    Ok(key.into_owned())
}

fn claimed(key: &str, fence: u64, previous: Option<u64>) -> Response<ProxyBody> {
    let body = serde_json::to_vec(&Claimed {
        key,
        fence,
        previous,
    })
    .map(Bytes::from)
    .unwrap_or_default();
    let mut response = Response::new(full_body(body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
