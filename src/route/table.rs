//! The compiled route table: every configured route validated once, then matched in file order.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};

use super::{Captures, KeyTemplate, PathPattern, PathRefusal};
use crate::config::{
    Compare, FenceMode, OnStoreError, Ordering, RouteConfig, DEFAULT_FENCED_METHODS,
};
use crate::fence::{signature_key_from_env, SignatureKey};
use crate::idempotency::IdempotencySettings;
use crate::proxy::UpstreamTarget;
use crate::stats::RouteCounters;

/// Paths under this prefix belong to the gateway itself (claiming) and are never routed upstream.
pub const RESERVED_PREFIX: &str = "/_fencegate/";

/// A route ready for the request path.
#[derive(Debug)]
pub struct CompiledRoute {
    pub name: String,
    pub pattern: PathPattern,
    pub fenced_methods: Vec<Method>,
    pub upstream: UpstreamTarget,
    pub resource_key: Option<KeyTemplate>,
    pub timeout: Duration,
    pub trust_forwarded: bool,
    pub preserve_host: bool,
    /// Largest request body forwarded (413 above).
    pub max_body: usize,
    pub fence: FenceSettings,
    pub idempotency: Option<IdempotencySettings>,
    pub counters: RouteCounters,
}

/// The `[routes.fence]` table, compiled.
#[derive(Debug, Clone)]
pub struct FenceSettings {
    pub header: HeaderName,
    pub mode: FenceMode,
    pub compare: Compare,
    pub store_timeout: Duration,
    pub on_store_error: OnStoreError,
    pub ordering: Ordering,
    pub gate_timeout: Duration,
    /// Refuse tokens more than this far above the key's mark.
    pub max_advance: Option<u64>,
    /// Require tokens signed by the lock authority with this key.
    pub signature: Option<SignatureKey>,
}

impl CompiledRoute {
    /// Whether a request with this method goes through the fence check.
    pub fn fences(&self, method: &Method) -> bool {
        self.fence.mode != FenceMode::Off && self.fenced_methods.contains(method)
    }
}

/// A request's route and what its path captured.
#[derive(Debug, Clone)]
pub struct RouteMatch {
    pub route: Arc<CompiledRoute>,
    pub captures: Captures,
}

/// Why a route did not compile; `field` is relative to the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteError {
    pub route: String,
    pub field: &'static str,
    pub message: String,
}

/// All routes, matched in the order the file lists them.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Arc<CompiledRoute>>,
}

impl RouteTable {
    pub fn compile(configs: &[RouteConfig]) -> Result<RouteTable, RouteError> {
        let mut routes: Vec<Arc<CompiledRoute>> = Vec::with_capacity(configs.len());
        for config in configs {
            if routes.iter().any(|r| r.name == config.name) {
                return Err(error(config, "name", "another route already has this name"));
            }
            routes.push(Arc::new(compile_route(config)?));
        }
        Ok(RouteTable { routes })
    }

    /// The first route whose pattern has the shape of `path` (raw, without the query): its
    /// match, or why its captures are malformed. A malformed capture does not fall through to a
    /// later route: the request was meant for this one.
    pub fn find(&self, path: &str) -> Result<Option<RouteMatch>, PathRefusal> {
        for route in &self.routes {
            if let Some(captures) = route.pattern.match_path(path)? {
                return Ok(Some(RouteMatch {
                    route: Arc::clone(route),
                    captures,
                }));
            }
        }
        Ok(None)
    }

    pub fn routes(&self) -> impl Iterator<Item = &Arc<CompiledRoute>> {
        self.routes.iter()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<CompiledRoute>> {
        self.routes.iter().find(|r| r.name == name)
    }
}

fn compile_route(config: &RouteConfig) -> Result<CompiledRoute, RouteError> {
    if config.name.trim().is_empty() {
        return Err(error(config, "name", "must not be empty"));
    }
    let pattern =
        PathPattern::parse(&config.path).map_err(|e| error(config, "path", e.to_string()))?;
    if pattern.literal_prefix().starts_with(RESERVED_PREFIX)
        || config.path.starts_with(RESERVED_PREFIX)
    {
        return Err(error(
            config,
            "path",
            format!("{RESERVED_PREFIX} is reserved for the gateway"),
        ));
    }
    let fenced_methods = match &config.methods {
        None => DEFAULT_FENCED_METHODS
            .iter()
            .map(|m| {
                Method::from_bytes(m.as_bytes())
                    .map_err(|e| error(config, "methods", e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(list) => list
            .iter()
            .map(|m| parse_method(config, m))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let upstream =
        UpstreamTarget::parse(&config.upstream).map_err(|e| error(config, "upstream", e))?;
    let header = HeaderName::from_bytes(config.fence.header.as_bytes())
        .map_err(|_| error(config, "fence.header", "not a valid header name"))?;
    let resource_key = match &config.resource_key {
        Some(template) => Some(
            KeyTemplate::parse(template, pattern.param_names())
                .map_err(|e| error(config, "resource_key", e.to_string()))?,
        ),
        None if config.fence.mode == FenceMode::Off => None,
        None => {
            return Err(error(
                config,
                "resource_key",
                "required unless fence.mode = \"off\" (e.g. resource_key = \"invoice:{id}\")",
            ))
        }
    };
    let signature = match &config.fence.signature_secret_env {
        None => None,
        Some(name) => Some(
            signature_key_from_env(&config.fence.signature_header, name)
                .map_err(|e| error(config, e.field, e.message))?,
        ),
    };
    let idempotency = match &config.idempotency {
        None => None,
        Some(table) => Some(
            IdempotencySettings::compile(table, &pattern)
                .map_err(|e| error(config, e.field, e.message))?,
        ),
    };
    Ok(CompiledRoute {
        idempotency,
        name: config.name.clone(),
        pattern,
        fenced_methods,
        upstream,
        resource_key,
        timeout: config.timeout,
        trust_forwarded: config.trust_forwarded,
        preserve_host: config.preserve_host,
        max_body: config.max_body,
        fence: FenceSettings {
            header,
            mode: config.fence.mode,
            compare: config.fence.compare,
            store_timeout: config.fence.store_timeout,
            on_store_error: config.fence.on_store_error,
            ordering: config.fence.ordering,
            gate_timeout: config.fence.gate_timeout,
            max_advance: config.fence.max_advance,
            signature,
        },
        counters: RouteCounters::default(),
    })
}

fn parse_method(config: &RouteConfig, name: &str) -> Result<Method, RouteError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(error(
            config,
            "methods",
            format!("{name:?} is not an upper-case HTTP method"),
        ));
    }
    Method::from_bytes(name.as_bytes()).map_err(|e| error(config, "methods", e.to_string()))
}

fn error(config: &RouteConfig, field: &'static str, message: impl Into<String>) -> RouteError {
    RouteError {
        route: config.name.clone(),
        field,
        message: message.into(),
    }
}
