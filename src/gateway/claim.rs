//! `POST /_fencegate/claim/{resource_key}`: a new lock holder raises its key's mark to its token
//! without writing anything upstream (DESIGN §5), so a zombie's write that would otherwise arrive
//! before the holder's first write is refused too.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::config::{Compare, DEFAULT_STORE_TIMEOUT};
use crate::error::GatewayError;
use crate::fence::read_fence_header;
use crate::proxy::{full_body, ProxyBody};
use crate::route::{MAX_RESOURCE_KEY_LEN, RESERVED_PREFIX};
use crate::store::{Advance, FenceStore};

/// The claim endpoint's path below the reserved prefix.
const CLAIM_PATH: &str = "claim/";
/// Claims always read the default fence header (`X-Fence`): they belong to no route.
const CLAIM_FENCE_HEADER: http::HeaderName = http::HeaderName::from_static("x-fence");
/// What claims report as their route in logs and problems.
const CLAIM_ROUTE: &str = "_claim";

#[derive(Clone)]
pub struct Claim {
    store: Arc<dyn FenceStore>,
}

#[derive(Serialize)]
struct Claimed<'a> {
    key: &'a str,
    fence: u64,
    previous: Option<u64>,
}

impl Claim {
    pub fn new(store: Arc<dyn FenceStore>) -> Claim {
        Claim { store }
    }

    /// Answers a request under the reserved prefix. Claims compare monotonically: re-claiming the
    /// token one already holds succeeds, so a client may retry a claim whose answer it lost.
    pub async fn handle<B>(
        &self,
        request: Request<B>,
    ) -> Result<Response<ProxyBody>, GatewayError> {
        let path = request.uri().path();
        let Some(raw_key) = path
            .strip_prefix(RESERVED_PREFIX)
            .and_then(|p| p.strip_prefix(CLAIM_PATH))
        else {
            return Err(GatewayError::ReservedNotFound {
                path: path.to_owned(),
            });
        };
        if request.method() != Method::POST {
            return Err(GatewayError::MethodNotAllowed { allow: "POST" });
        }
        let key = decode_key(raw_key)?;
        let token = read_fence_header(request.headers(), &CLAIM_FENCE_HEADER).map_err(|error| {
            GatewayError::Token {
                route: CLAIM_ROUTE.to_owned(),
                key: key.clone(),
                error,
            }
        })?;
        let advanced = tokio::time::timeout(
            DEFAULT_STORE_TIMEOUT,
            self.store.advance(&key, token, Compare::Monotonic),
        )
        .await;
        match advanced {
            Ok(Ok(Advance::Accepted { previous })) => {
                tracing::info!(%key, token, ?previous, "claimed");
                Ok(claimed(&key, token, previous))
            }
            Ok(Ok(Advance::Stale { current })) => Err(GatewayError::StaleFence {
                route: CLAIM_ROUTE.to_owned(),
                key,
                token,
                current,
            }),
            Ok(Err(source)) => Err(GatewayError::StoreFailed {
                route: CLAIM_ROUTE.to_owned(),
                key,
                source,
            }),
            Err(_) => Err(GatewayError::StoreTimeout {
                route: CLAIM_ROUTE.to_owned(),
                key,
                after: DEFAULT_STORE_TIMEOUT,
            }),
        }
    }
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
