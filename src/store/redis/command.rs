//! The requests a writer is sent (`Command`) and how each is answered: from the advance script's
//! answer, with an error, and whether it may be sent twice.

use std::sync::Arc;

use redis::{Cmd, Value};
use tokio::sync::oneshot;

use super::error::{backend_error, wrap};
use super::script::{read_advance, split_advances, unexpected, AdvanceAnswers};
use crate::config::Compare;
use crate::store::expected::mismatch_reason;
use crate::store::{Advance, StoreError, StoreIdentity};

pub(super) enum Command {
    Advance {
        key: String,
        token: u64,
        compare: Compare,
        reply: oneshot::Sender<Result<Advance, StoreError>>,
    },
    Current {
        key: String,
        reply: oneshot::Sender<Result<Option<u64>, StoreError>>,
    },
    Identity {
        reply: oneshot::Sender<Result<StoreIdentity, StoreError>>,
    },
    /// Commands for the next pipeline, answered in order (the intent store's scripts and reads).
    /// A command that meets a server error is answered with it; the others still run.
    Commands {
        commands: Vec<Cmd>,
        reply: oneshot::Sender<Result<Vec<Value>, StoreError>>,
        /// Whether sending them twice does what sending them once does (see
        /// [`Command::safe_to_repeat`]).
        repeatable: bool,
    },
    /// Commands for the next pipeline whose answers nobody waits for (a turn's release).
    Forget {
        commands: Vec<Cmd>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

impl Command {
    /// Whether sending the command twice does what sending it once does: reads, the identity's
    /// `SET NX`, a turn's release (a compare-and-delete), advances (compare-and-set; a repeated
    /// one's answer is checked, see `answer_advances`), and command groups marked so (turn takes
    /// and renewals; the take script tells a repeat of its own take apart). Intent scripts, whose
    /// answers depend on whether the first attempt ran, are not.
    pub(super) fn safe_to_repeat(&self) -> bool {
        match self {
            Command::Advance { .. }
            | Command::Current { .. }
            | Command::Identity { .. }
            | Command::Forget { .. } => true,
            Command::Commands { repeatable, .. } => *repeatable,
            Command::Close { .. } => false,
        }
    }
}

/// Answers each of `advances` from its part of the advance script's `answer`.
/// After a repeat (`retried`), a stale answer whose mark is the advance's own token may be the
/// lost first attempt's doing: it is answered as a failure, never as stale.
pub(super) fn answer_advances(
    advances: Vec<Command>,
    answer: Value,
    expected: Option<&str>,
    retried: bool,
) {
    match split_advances(answer, advances.len()) {
        Ok(AdvanceAnswers::Wiped { found }) => {
            let reason = mismatch_reason(expected.unwrap_or_default(), found.as_deref());
            for command in advances {
                fail(command, || StoreError::Untrusted {
                    reason: reason.clone(),
                });
            }
        }
        Ok(AdvanceAnswers::Each(answers)) => {
            for (command, answer) in advances.into_iter().zip(answers) {
                if let Command::Advance {
                    token,
                    compare,
                    reply,
                    ..
                } = command
                {
                    let outcome = match read_advance(answer, token, compare) {
                        Ok(Advance::Stale { current }) if retried && current == token => {
                            Err(wrap(unexpected(
                                "the answer to a repeated advance may be its own first attempt's"
                                    .to_owned(),
                            )))
                        }
                        other => other.map_err(wrap),
                    };
                    let _ = reply.send(outcome);
                }
            }
        }
        Err(source) => {
            let source = Arc::new(source);
            for command in advances {
                fail(command, || backend_error(&source));
            }
        }
    }
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
        Command::Commands { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Forget { .. } => {}
        Command::Close { reply } => return Some(reply),
    }
    None
}
