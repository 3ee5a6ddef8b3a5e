//! Plumbing more than one backend uses: the per-thread task handles, the request/reply mailbox,
//! flat combining, the batching loop, the SQL backends' intent row and the URL redactor. Nothing
//! here knows a backend's schema or wire format.

pub(crate) mod combining;
pub(crate) mod intent_rows;
pub(crate) mod mailbox;
pub(crate) mod per_thread;
pub(crate) mod redact;
