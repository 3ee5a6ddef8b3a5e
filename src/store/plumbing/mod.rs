//! Plumbing more than one backend uses: the per-thread task handles, the request/reply mailbox,
//! flat combining, the batching loop, the SQL backends' intent row and the URL redactor. Nothing
//! here knows a backend's schema or wire format.

pub(super) mod batches;
pub(super) mod combining;
pub(super) mod intent_rows;
pub(super) mod mailbox;
pub(super) mod per_thread;
pub(super) mod redact;
