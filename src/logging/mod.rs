//! Logging: lines on stderr as text for people or JSON for log shippers, filtered by `RUST_LOG`,
//! with no raw control character from a request in any field of either ([`escape`] has the rule).

pub mod escape;
