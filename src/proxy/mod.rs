//! Forwarding to upstreams (docs/design.md §7): the upstream address of a route, the RFC 9110
//! header rules a proxy must apply, the stack's shared future and service shapes, and the forwarding
//! service, with the decoder of HTTP/1 message bodies (`body_decoder`). (The body types are
//! `crate::body`; a route's upstream is `crate::route`.)

pub mod body_decoder;
mod capture;
mod client_stream;
pub mod extensions;
mod forward;
mod h1;
mod headers;
mod prefixed;
mod stack;
mod tls_pools;
mod upstream_dial;
mod upstream_pool;
mod upstream_slots;

pub use capture::{read_prefix, read_request, Prefix, ReadFailure};
pub use client_stream::{client_body_fault, streamed_body, ClientBodyFailed, ClientBodyStalled};
pub use forward::{ClientAddr, Proxy, MAX_IDLE_UPSTREAM_CONNECTIONS_PER_HOST};
pub use headers::{
    append_forwarded_headers, append_via, strip_hop_by_hop_headers, strip_path_override_headers,
    ClientNode, ForwardedFor,
};
pub use prefixed::Prefixed;
pub use stack::{ProxyFuture, StackService};
pub use upstream_slots::{slot_name, UpstreamBusy, UpstreamSlots};
