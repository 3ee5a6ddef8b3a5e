//! Routes: the canonical form of a request's path and method, matching it against configured
//! patterns, and rendering the resource key of the match. Compiled once from the configuration;
//! read-only on the request path.

mod advance_by;
mod canonical;
mod counters;
mod fold;
mod idempotency;
mod method;
mod pattern;
mod table;
mod template;
mod upstream;
mod upstream_headers;

pub use advance_by::AdvanceBy;
pub use canonical::{canonicalize, CanonicalPath, PathRefusal, MAX_CAPTURE_LEN};
pub use counters::{ResponseSeries, RouteCounters, RouteMetrics, METHOD_LABELS};
pub use fold::same_ignoring_case;
pub use idempotency::{
    is_replayable_header, IdempotencySettings, Inject, SettingsError, TEMPLATE_EXTRAS,
};
pub use method::{
    check_method_override, check_method_spelling, FencedMethods, MethodRefusal, UNFENCED_METHODS,
};
pub use pattern::{Captures, PathMatch, PathPattern, PatternError};
pub use table::{CompiledRoute, RouteError, RouteMatch, RouteTable, RESERVED_PREFIX};
pub use template::{KeyTemplate, RenderError, RequestParts, TemplateError, MAX_RESOURCE_KEY_LEN};
pub use upstream::UpstreamTarget;
pub use upstream_headers::{compile_strip_list, HeaderError, UpstreamHeaders};
