//! The fence as a tower layer for a service's own handlers (axum, hyper or any tower service),
//! without the proxy: each write's token is compared with its resource key's mark and the mark
//! advanced, durably, before the handler runs (I1, I2); refusals are the gateway's own problem
//! responses. Serializing a key's writes (I4) and idempotency stay the gateway's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use tower::{Layer, Service};

use crate::config::Compare;
use crate::error::{GatewayError, RequestError};
use crate::fence::FencedWrite;
use crate::guard::CheckedStore;
use crate::route::UNFENCED_METHODS;
use crate::token::read_fence_header;

/// What a request's resource key may be derived from.
pub struct RequestHead<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a http::HeaderMap,
}

/// A request's resource key, or `None` when the request names none (refused with 400).
pub type KeyOf = dyn Fn(&RequestHead<'_>) -> Option<String> + Send + Sync;

/// How the fence reads and checks a service's writes.
#[derive(Clone)]
struct Settings {
    store: Arc<CheckedStore>,
    key_of: Arc<KeyOf>,
    header: HeaderName,
    compare: Compare,
    store_timeout: Duration,
}

/// Fences every request but `GET`, `HEAD`, `OPTIONS` and `TRACE` of the service it wraps.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use fencegate::embed::FencingLayer;
/// use fencegate::guard::CheckedStore;
/// use fencegate::store::EmbeddedStore;
///
/// let store = EmbeddedStore::open(std::path::Path::new("marks.db"), 512).await?;
/// let store = Arc::new(CheckedStore::standalone(Arc::new(store), 100_000));
/// let fence = FencingLayer::new(store, |head| {
///     head.uri.path().strip_prefix("/accounts/").map(|id| format!("account:{id}"))
/// });
/// let app: axum::Router = axum::Router::new()
///     .route("/accounts/{id}", axum::routing::put(|| async { "written" }))
///     .layer(fence);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FencingLayer {
    settings: Arc<Settings>,
}

impl FencingLayer {
    /// Reads the token from `X-Fence`, compares monotonically and gives the store 2 s, as a
    /// gateway route does by default.
    pub fn new(
        store: Arc<CheckedStore>,
        key_of: impl Fn(&RequestHead<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> FencingLayer {
        FencingLayer {
            settings: Arc::new(Settings {
                store,
                key_of: Arc::new(key_of),
                header: HeaderName::from_static("x-fence"),
                compare: Compare::Monotonic,
                store_timeout: Duration::from_secs(2),
            }),
        }
    }

    fn settings_mut(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The header the token is read from.
    pub fn header(mut self, header: HeaderName) -> FencingLayer {
        self.settings_mut().header = header;
        self
    }

    /// `Compare::Strict`: a token equal to the mark is refused too.
    pub fn compare(mut self, compare: Compare) -> FencingLayer {
        self.settings_mut().compare = compare;
        self
    }

    /// How long the store may take before the write is refused with 503.
    pub fn store_timeout(mut self, timeout: Duration) -> FencingLayer {
        self.settings_mut().store_timeout = timeout;
        self
    }
}

impl<S> Layer<S> for FencingLayer {
    type Service = Fencing<S>;

    fn layer(&self, inner: S) -> Fencing<S> {
        Fencing {
            settings: Arc::clone(&self.settings),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Fencing<S> {
    settings: Arc<Settings>,
    inner: S,
}

impl<S, B, R> Service<Request<B>> for Fencing<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    R: From<Bytes>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if UNFENCED_METHODS.contains(request.method()) {
            return Box::pin(self.inner.call(request));
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = Arc::clone(&self.settings);
        let (parts, body) = request.into_parts();
        Box::pin(async move {
            match admit(&settings, &parts).await {
                Ok(()) => inner.call(Request::from_parts(parts, body)).await,
                Err(refusal) => Ok(refuse(refusal)),
            }
        })
    }
}

/// Renders the key, reads the token and compare-and-advances the mark.
async fn admit(settings: &Settings, request: &http::request::Parts) -> Result<(), RequestError> {
    let head = RequestHead {
        method: &request.method,
        uri: &request.uri,
        headers: &request.headers,
    };
    let key = (settings.key_of)(&head).ok_or(GatewayError::NoResourceKey)?;
    let token = match read_fence_header(&request.headers, &settings.header) {
        Ok(token) => token,
        Err(error) => return Err(GatewayError::Token { error }.for_key(key)),
    };
    let write = FencedWrite {
        key: &key,
        token,
        compare: settings.compare,
        store_timeout: settings.store_timeout,
        counters: None,
    };
    write.advance(&settings.store).await.map(drop)
}

/// The refusal as the gateway answers it: problem details, with `X-Fence-Current` or
/// `Retry-After` where the gateway sends them.
fn refuse<R: From<Bytes>>(refusal: RequestError) -> Response<R> {
    let (problem, extra) = refusal.answer();
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(R::from(Bytes::from(problem.to_json())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some((name, value)) = extra {
        response.headers_mut().insert(name, value);
    }
    response
}
