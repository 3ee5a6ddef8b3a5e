//! The compiled route table: every configured route validated once, then matched in file order.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method};
use smallvec::SmallVec;

use super::advance_by::{AdvanceBy, InstalledOwner};
use super::counters::{RouteCounters, RouteMetrics};
use super::idempotency::IdempotencySettings;
use super::upstream::UpstreamTarget;
use super::upstream_headers::{compile_strip_list, UpstreamHeaders};
use super::{CanonicalPath, Captures, FencedMethods, KeyTemplate, PathPattern, PathRefusal};
use crate::authority::AuthoritySettings;
use crate::config::{
    CollectionWrites, Compare, FenceMode, FormatSuffix, OnStoreError, Ordering, PathParameters,
    RouteConfig,
};
use crate::input_type::InputType;
use crate::tls::UpstreamTls;
use crate::token::{signature_key_from, SignatureKey};
use crate::upstream_auth::UpstreamAuth;

/// Paths under this prefix belong to the gateway itself (claiming) and are never routed upstream.
pub const RESERVED_PREFIX: &str = "/_fencegate/";

/// A route ready for the request path.
#[derive(Debug)]
pub struct CompiledRoute {
    pub name: String,
    pub pattern: PathPattern,
    /// Compare the pattern's literals with the path's exactly, not ASCII-case-insensitively.
    pub case_sensitive: bool,
    /// What a path with `;` parameters does on this route.
    pub path_parameters: PathParameters,
    /// What a `.suffix` in the last segment does on this route.
    pub format_suffix: FormatSuffix,
    /// Whether writes that may act on a collection of this route's matches are refused.
    pub collection_writes: CollectionWrites,
    pub fenced_methods: FencedMethods,
    pub upstream: UpstreamTarget,
    /// The TLS settings of an `https://` upstream (none for `http://`).
    pub upstream_tls: Option<UpstreamTls>,
    /// Headers set on every forwarded request (credentials, usually).
    pub upstream_headers: UpstreamHeaders,
    /// Credentials the gateway obtains for the upstream (`[routes.upstream_auth]`), set as
    /// `Authorization` on every forwarded request.
    pub upstream_auth: Option<Arc<UpstreamAuth>>,
    /// Response headers removed before answering.
    pub strip_response_headers: Vec<HeaderName>,
    pub resource_key: Option<KeyTemplate>,
    /// Whether a key reads a typed query parameter or header, which forwarding makes canonical.
    pub typed_inputs: bool,
    pub timeout: Duration,
    pub trust_forwarded: bool,
    pub preserve_host: bool,
    /// Largest request body forwarded (413 above).
    pub max_body: usize,
    pub fence: FenceSettings,
    pub idempotency: Option<IdempotencySettings>,
    /// Set once by `Metrics::bind` when the table is installed; read through [`Self::counters`].
    pub fence_counters: OnceLock<RouteCounters>,
    /// Which layer makes the route's advance, set once when the table is installed; read
    /// through [`Self::advance_by`].
    pub advance_owner: InstalledOwner,
    /// The route's series of the labelled metrics, set by `Metrics::of_route` on first use.
    pub metrics: OnceLock<RouteMetrics>,
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
    /// How much of a serialized write's response is read ahead so that its turn ends with the
    /// upstream.
    pub response_read_ahead: usize,
    /// The lock service the tokens come from, followed by the gateway.
    pub authority: Option<Arc<AuthoritySettings>>,
}

impl CompiledRoute {
    /// The route's fence counters: the registry's series once the table is installed in a
    /// gateway, detached ones before.
    pub fn counters(&self) -> &RouteCounters {
        self.fence_counters.get_or_init(RouteCounters::detached)
    }

    /// Which layer makes this route's compare-and-advance (the fence, before the table is
    /// installed in a gateway).
    pub fn advance_by(&self) -> AdvanceBy {
        self.advance_owner.get()
    }

    /// The owner of this route's advance: the idempotency layer on an idempotent route (with
    /// beginning the intent), else the ordering gate on a serialized route when the store takes
    /// turns and advances in one step (`turns_advance`: PostgreSQL, Redis and etcd), else the
    /// fence. Only under `mode = "enforce"` with `on_store_error = "fail_closed"`, where a refused
    /// advance always ends the request: observe and fail-open routes forward past a refusal, so
    /// the fence makes theirs before anything else.
    pub fn owner(&self, turns_advance: bool) -> AdvanceBy {
        let later = if self.idempotency.is_some() {
            AdvanceBy::Intent
        } else if turns_advance && self.fence.ordering == Ordering::Serialize {
            AdvanceBy::Turn
        } else {
            return AdvanceBy::Fence;
        };
        let ends_on_refusal = self.fence.mode == FenceMode::Enforce
            && self.fence.on_store_error == OnStoreError::FailClosed;
        if ends_on_refusal {
            later
        } else {
            AdvanceBy::Fence
        }
    }

    /// Whether a request with this method goes through the fence check.
    pub fn fences(&self, method: &Method) -> bool {
        self.fence.mode != FenceMode::Off && self.fenced_methods.contains(method)
    }

    /// Whether the route checks or records anything at all (a fence, or idempotency).
    pub fn is_guarded(&self) -> bool {
        self.fence.mode != FenceMode::Off || self.idempotency.is_some()
    }

    /// Whether a request with this method is checked by the fence or recorded by the idempotency
    /// layer: a request the gateway must not let reach another resource than the one it keyed.
    pub fn guards(&self, method: &Method) -> bool {
        self.fences(method) || (self.idempotency.is_some() && self.fenced_methods.contains(method))
    }

    /// The key templates of the route: its resource key and its idempotency key.
    fn key_templates(&self) -> impl Iterator<Item = &KeyTemplate> {
        self.resource_key
            .iter()
            .chain(self.idempotency.as_ref().map(|settings| &settings.key))
    }

    /// Puts the typed query parameters and headers the route's keys read in the canonical form
    /// they are keyed by (typed path segments already are, in the matched path): headers in
    /// place, and the query returned when it changed.
    pub fn canonicalize_inputs(
        &self,
        headers: &mut HeaderMap,
        query: Option<&str>,
    ) -> Option<String> {
        if !self.typed_inputs {
            return None;
        }
        let mut rewritten: Option<String> = None;
        for template in self.key_templates().filter(|t| t.has_typed_inputs()) {
            let current = rewritten.as_deref().or(query);
            if let Some(query) = template.canonicalize_inputs(headers, current) {
                rewritten = Some(query);
            }
        }
        rewritten
    }

    /// The placeholders of the route's keys that declare no type (`{id}`, `{query:id}`), which
    /// the untyped rule applies to; for `check-config`.
    pub fn untyped_placeholders(&self) -> Vec<String> {
        // Names that are no segment are the idempotency template's extras: plain strings.
        let segment_type = |name: &str| self.pattern.param_type(name).unwrap_or(InputType::Str);
        let mut found: Vec<String> = Vec::new();
        for template in self.key_templates() {
            for placeholder in template.untyped_placeholders(segment_type) {
                if !found.contains(&placeholder) {
                    found.push(placeholder);
                }
            }
        }
        found
    }
}

/// A request's route and what its path captured.
#[derive(Debug, Clone)]
pub struct RouteMatch {
    pub route: Arc<CompiledRoute>,
    pub captures: Captures,
    /// The canonical path that matched, as it is forwarded.
    pub path: String,
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
            let route = compile_route(config)?;
            if let Some(earlier) = routes
                .iter()
                .find(|r| r.pattern.covers(&route.pattern, r.case_sensitive))
            {
                return Err(error(
                    config,
                    "path",
                    format!(
                        "route {:?}, listed earlier, matches every path this pattern matches (literals compare without letter case), so this route would never be used; list the more specific route first",
                        earlier.name
                    ),
                ));
            }
            routes.push(Arc::new(route));
        }
        Ok(RouteTable { routes })
    }

    /// The route of a request: the first, in file order, whose pattern matches the canonical
    /// `path`, or why the path is refused. A malformed capture does not fall through to a later
    /// route: the request was meant for this one.
    ///
    /// A path with `;` parameters is read both ways upstreams read it: literally (Flask, Express,
    /// Go, nginx) and with the parameters stripped (Tomcat, Spring). When the stripped reading's
    /// route says `path_parameters = "strip"`, the stripped path is routed and forwarded; else,
    /// when either reading lands on a route that guards `method`, the request is refused.
    pub fn find(
        &self,
        path: &CanonicalPath,
        method: &Method,
    ) -> Result<Option<RouteMatch>, PathRefusal> {
        let found = self.find_parameters(path, method)?;
        if let Some(found) = &found {
            self.check_format_suffix(found, method)?;
        }
        Ok(found)
    }

    fn find_parameters(
        &self,
        path: &CanonicalPath,
        method: &Method,
    ) -> Result<Option<RouteMatch>, PathRefusal> {
        if !path.has_parameters() {
            return self.first_match(path);
        }
        let stripped = self.first_match(&path.without_parameters())?;
        if let Some(found) = &stripped {
            if found.route.path_parameters == PathParameters::Strip {
                return Ok(stripped);
            }
        }
        let literal = self.first_match(path)?;
        let guarded =
            |found: &Option<RouteMatch>| found.as_ref().is_some_and(|f| f.route.guards(method));
        if guarded(&stripped) || guarded(&literal) {
            return Err(PathRefusal::PathParameters);
        }
        Ok(literal)
    }

    /// Rails (`/invoices/:id(.:format)`) and Spring before 5.3 (suffix pattern matching) read
    /// `/invoices/7.json` as `/invoices/7`. When this request is guarded and the path without its
    /// last segment's suffix (from the first or the last dot) is another match of a guarded
    /// route, the two readings would fence different keys: refused, unless the route reads the
    /// suffix literally.
    fn check_format_suffix(&self, found: &RouteMatch, method: &Method) -> Result<(), PathRefusal> {
        if found.route.format_suffix == FormatSuffix::Literal || !found.route.guards(method) {
            return Ok(());
        }
        let path = found.path.strip_suffix('/').unwrap_or(&found.path);
        let (head, last) = path.rsplit_once('/').unwrap_or(("", path));
        let (Some(first), Some(final_dot)) = (last.find('.'), last.rfind('.')) else {
            return Ok(());
        };
        for dot in [first, final_dot] {
            if dot == 0 {
                continue;
            }
            let Ok(shorter) = super::canonicalize(&format!("{head}/{}", &last[..dot])) else {
                continue;
            };
            if let Some(other) = self.first_match(&shorter)? {
                let same =
                    Arc::ptr_eq(&other.route, &found.route) && other.captures == found.captures;
                if other.route.guards(method) && !same {
                    return Err(PathRefusal::FormatSuffix);
                }
            }
        }
        Ok(())
    }

    /// A guarded route some of whose resources lie below `path`, when a recursive write there
    /// (DELETE or MOVE of it, MOVE or COPY onto it) would reach them: a route whose pattern has
    /// `path` as a proper ancestor, or the route `path` matches when it ends in `{*rest}` and does
    /// not allow collection writes.
    pub fn collection_guard(&self, path: &CanonicalPath) -> Option<&Arc<CompiledRoute>> {
        let below = self.routes.iter().find(|route| {
            route.is_guarded() && route.pattern.has_descendants(path, route.case_sensitive)
        });
        below.or_else(|| {
            let found = self.first_match(path).ok().flatten()?;
            let route = self.routes.iter().find(|r| Arc::ptr_eq(r, &found.route))?;
            (route.is_guarded()
                && route.pattern.ends_in_rest()
                && route.collection_writes == CollectionWrites::Refuse)
                .then_some(route)
        })
    }

    /// The first route whose pattern matches `path`, read literally.
    pub fn first_match(&self, path: &CanonicalPath) -> Result<Option<RouteMatch>, PathRefusal> {
        // Paths rarely have more segments than this: no allocation per request for the split.
        let segments: SmallVec<[&str; 8]> = path.segments().collect();
        let trailing_slash = path.has_trailing_slash();
        for route in &self.routes {
            let found =
                route
                    .pattern
                    .match_segments(&segments, trailing_slash, route.case_sensitive)?;
            if let Some(found) = found {
                return Ok(Some(RouteMatch {
                    route: Arc::clone(route),
                    captures: found.captures,
                    path: found.path,
                }));
            }
        }
        Ok(None)
    }

    /// Decides, once, which layer makes each route's advance, for a gateway whose store does
    /// (`turns_advance`) or does not take a key's turn and advance in one step. Called when the
    /// table is installed, before it serves.
    pub fn install_owners(&self, turns_advance: bool) {
        for route in &self.routes {
            route.advance_owner.set(route.owner(turns_advance));
        }
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
        None => FencedMethods::AllButSafe,
        Some(list) if list.is_empty() => {
            return Err(error(
                config,
                "methods",
                "an empty list fences nothing; leave `methods` out to fence every method but GET, HEAD, OPTIONS and TRACE, or set fence.mode = \"off\"",
            ))
        }
        Some(list) => FencedMethods::Listed(
            list.iter()
                .map(|m| parse_method(config, m))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let upstream =
        UpstreamTarget::parse(&config.upstream).map_err(|e| error(config, "upstream", e))?;
    let upstream_tls = match (&config.upstream_tls, upstream.is_https()) {
        (Some(_), false) => {
            return Err(error(config, "upstream_tls", "needs an https:// upstream"))
        }
        (table, true) => Some(
            UpstreamTls::compile(&table.clone().unwrap_or_default()).map_err(|e| {
                let field = match e.field() {
                    "ca_file" => "upstream_tls.ca_file",
                    "server_name" => "upstream_tls.server_name",
                    "client_cert" => "upstream_tls.client_cert",
                    "client_key" => "upstream_tls.client_key",
                    _ => "upstream_tls",
                };
                error(config, field, e.to_string())
            })?,
        ),
        (None, false) => None,
    };
    let header = HeaderName::from_bytes(config.fence.header.as_bytes())
        .map_err(|_| error(config, "fence.header", "not a valid header name"))?;
    let upstream_headers =
        UpstreamHeaders::compile(&config.upstream_headers, |name| std::env::var(name).ok())
            .map_err(|e| error(config, "upstream_headers", e.0))?;
    if upstream_headers.names().any(|name| *name == header) {
        return Err(error(
            config,
            "upstream_headers",
            format!("{header} is the route's fence header: it carries the client's token"),
        ));
    }
    let upstream_auth = match &config.upstream_auth {
        None => None,
        Some(table) => {
            if upstream_headers
                .names()
                .any(|name| *name == http::header::AUTHORIZATION)
            {
                return Err(error(
                    config,
                    "upstream_headers",
                    "Authorization is set by [routes.upstream_auth]; leave it out here",
                ));
            }
            let auth = UpstreamAuth::compile(table, upstream_tls.as_ref())
                .map_err(|e| error(config, upstream_auth_field(e.field), e.message))?;
            Some(Arc::new(auth))
        }
    };
    let strip_response_headers = compile_strip_list(&config.strip_response_headers)
        .map_err(|e| error(config, "strip_response_headers", e.0))?;
    let resource_key = match &config.resource_key {
        Some(template) => {
            let template = KeyTemplate::parse(template, pattern.param_names())
                .map_err(|e| error(config, "resource_key", e.to_string()))?;
            if template.reads_body() {
                return Err(error(
                    config,
                    "resource_key",
                    "{json:..} and {form:..} read the body, which the fence checks a token before reading; use them in [routes.idempotency] key",
                ));
            }
            Some(template)
        }
        None if config.fence.mode == FenceMode::Off => None,
        None => {
            return Err(error(
                config,
                "resource_key",
                "required unless fence.mode = \"off\" (e.g. resource_key = \"invoice:{id}\")",
            ))
        }
    };
    let signature = signature_key_from(
        &config.fence.signature_header,
        config.fence.signature_secret_env.as_deref(),
        config.fence.signature_secret_file.as_deref(),
    )
    .map_err(|e| error(config, e.field, e.message))?;
    let authority = match &config.fence.authority {
        None => None,
        Some(_) if config.fence.mode == FenceMode::Off => {
            return Err(error(
                config,
                "fence.authority",
                "fence.mode = \"off\" checks no tokens, so it follows no lock service",
            ))
        }
        Some(table) => Some(Arc::new(
            AuthoritySettings::compile(table, config.resource_key.as_deref(), |name| {
                pattern.param_type(name).unwrap_or_default()
            })
            .map_err(|e| error(config, e.field, e.message))?,
        )),
    };
    let idempotency = match &config.idempotency {
        None => None,
        Some(table) => Some(
            IdempotencySettings::compile(table, &pattern)
                .map_err(|e| error(config, e.field, e.message))?,
        ),
    };
    let mut route = CompiledRoute {
        typed_inputs: false,
        idempotency,
        name: config.name.clone(),
        pattern,
        case_sensitive: config.case_sensitive,
        path_parameters: config.path_parameters,
        format_suffix: config.format_suffix,
        collection_writes: config.collection_writes,
        fenced_methods,
        upstream,
        upstream_tls,
        upstream_headers,
        upstream_auth,
        strip_response_headers,
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
            response_read_ahead: config.fence.response_read_ahead,
            authority,
        },
        fence_counters: OnceLock::new(),
        advance_owner: InstalledOwner::default(),
        metrics: OnceLock::new(),
    };
    let typed_inputs = route.key_templates().any(KeyTemplate::has_typed_inputs);
    route.typed_inputs = typed_inputs;
    Ok(route)
}

fn parse_method(config: &RouteConfig, name: &str) -> Result<Method, RouteError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_uppercase() || b == b'-') {
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

/// The full name of a `[routes.upstream_auth]` field.
fn upstream_auth_field(field: &'static str) -> &'static str {
    match field {
        "token_url" => "upstream_auth.token_url",
        "client_id" => "upstream_auth.client_id",
        "client_secret" => "upstream_auth.client_secret",
        "timeout" => "upstream_auth.timeout",
        _ => "upstream_auth",
    }
}
