//! The checks of a request's head that every upstream reading of it depends on, made before any
//! layer of the stack: the `Host` it addresses, a WebDAV `Destination` it names and the transfer
//! coding of its body. Their refusals are plain data that the error module answers.

mod destination;
mod host;
mod transfer_coding;

pub use destination::{check_destination, DestinationRefusal, DESTINATION};
pub use host::{check_host, same_authority, HostRefusal};
pub use transfer_coding::transfer_coding_is_plain;
