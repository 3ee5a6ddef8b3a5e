//! Forwarding to upstreams (DESIGN §7): the upstream address of a route, the RFC 9110 header
//! rules a proxy must apply, the body type the gateway answers with, and the forwarding service.

mod body;
mod forward;
mod headers;
mod target;

pub use body::{
    full_body, is_body_limit_exceeded, BodyLimitExceeded, BoxError, ProxyBody, ProxyFuture,
    RequestBody, StackService,
};
pub use forward::{ClientAddr, Proxy, UpstreamClient, MAX_IDLE_UPSTREAM_CONNECTIONS_PER_HOST};
pub use headers::{
    append_forwarded_headers, append_via, strip_hop_by_hop_headers, strip_path_override_headers,
    ClientNode, ForwardedFor,
};
pub use target::UpstreamTarget;
