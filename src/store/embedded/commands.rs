//! What the embedded store's callers queue for its writer: fence commands ([`Command`]) and intent
//! commands ([`IntentCommand`]), each carrying the channel its answer goes back on, and how one is
//! answered with an error without being run.

use tokio::sync::oneshot;

use crate::config::Compare;
use crate::store::intents::{
    BeginRequest, Begun, IntentCensus, IntentRecord, Resolution, StoredOutcome,
};
use crate::store::{Advance, StoreError, StoreIdentity};

/// A `FenceStore` call (or an intent command), queued for the writer.
pub(super) enum Command {
    Advance {
        key: String,
        token: u64,
        compare: Compare,
        reply: oneshot::Sender<Result<Advance, StoreError>>,
        /// An intent to begin in the same batch if the token is accepted (dropped otherwise).
        then_begin: Option<IntentCommand>,
    },
    Current {
        key: String,
        reply: oneshot::Sender<Result<Option<u64>, StoreError>>,
    },
    Identity {
        reply: oneshot::Sender<Result<StoreIdentity, StoreError>>,
    },
    Intent(IntentCommand),
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// Answers `command` with `error()`; a close request is handed back to the caller instead.
pub(super) fn fail(
    command: Command,
    error: impl Fn() -> StoreError,
) -> Option<oneshot::Sender<()>> {
    match command {
        Command::Advance { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Current { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Identity { reply } => {
            let _ = reply.send(Err(error()));
        }
        Command::Intent(command) => command.fail(error()),
        Command::Close { reply } => return Some(reply),
    }
    None
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// An `IntentStore` call, queued for the writer task.
pub(super) enum IntentCommand {
    Begin {
        request: BeginRequest,
        reply: Reply<Begun>,
    },
    Complete {
        key: String,
        outcome: StoredOutcome,
        now_ms: u64,
        reply: Reply<bool>,
    },
    Abandon {
        key: String,
        attempt: String,
        now_ms: u64,
        reply: Reply<()>,
    },
    Get {
        key: String,
        reply: Reply<Option<IntentRecord>>,
    },
    ListSubmitting {
        updated_before_ms: u64,
        limit: usize,
        reply: Reply<Vec<IntentRecord>>,
    },
    Census {
        reply: Reply<IntentCensus>,
    },
    Resolve {
        key: String,
        resolution: Resolution,
        now_ms: u64,
        reply: Reply<bool>,
    },
    Prune {
        now_ms: u64,
        limit: usize,
        reply: Reply<usize>,
    },
}

impl IntentCommand {
    /// Answers the command with `error` without running it.
    pub(super) fn fail(self, error: StoreError) {
        match self {
            IntentCommand::Begin { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::Complete { reply, .. } | IntentCommand::Resolve { reply, .. } => {
                drop(reply.send(Err(error)))
            }
            IntentCommand::Abandon { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::Get { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::ListSubmitting { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::Census { reply } => drop(reply.send(Err(error))),
            IntentCommand::Prune { reply, .. } => drop(reply.send(Err(error))),
        }
    }
}
