//! Routes: matching a request path against configured patterns, and rendering the resource key of
//! the match. Compiled once from the configuration; read-only on the request path.

mod path_check;
mod pattern;
mod table;
mod template;

pub use path_check::{check_path, PathRefusal, MAX_CAPTURE_LEN};
pub use pattern::{Captures, PathPattern, PatternError};
pub use table::{CompiledRoute, RouteError, RouteMatch, RouteTable, RESERVED_PREFIX};
pub use template::{KeyTemplate, RenderError, RequestParts, TemplateError, MAX_RESOURCE_KEY_LEN};
