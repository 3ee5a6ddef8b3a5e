//! The checks of a request's head that every upstream reading of it depends on, made before any
//! layer of the stack: the `Host` it addresses and a WebDAV `Destination` it names. Their
//! refusals are plain data that the error module answers.

mod destination;
mod host;

pub use destination::{check_destination, DestinationRefusal, DESTINATION};
pub use host::{check_host, same_authority, HostRefusal};
