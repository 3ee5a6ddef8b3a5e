//! Forwarding to upstreams (docs/design.md §7): the upstream address of a route, the RFC 9110
//! header rules a proxy must apply, the body type the gateway answers with, and the forwarding
//! service.

mod body;
mod client_stream;
mod forward;
mod headers;
mod prefixed;
mod target;
mod upstream_slots;

pub use body::{
    full_body, is_body_limit_exceeded, BodyLimitExceeded, BoxError, ProxyBody, ProxyFuture,
    RequestBody, StackService,
};
pub use client_stream::{client_body_fault, ClientBodyFailed, ClientBodyStalled};
pub use forward::{ClientAddr, Proxy, UpstreamClient, MAX_IDLE_UPSTREAM_CONNECTIONS_PER_HOST};
pub use headers::{
    append_forwarded_headers, append_via, strip_hop_by_hop_headers, strip_path_override_headers,
    ClientNode, ForwardedFor,
};
pub use prefixed::Prefixed;
pub use target::UpstreamTarget;
pub use upstream_slots::{slot_name, UpstreamBusy, UpstreamSlots};
