//! The request/reply mailbox of a backend whose connection is owned by a task (Redis): a caller
//! sends a command carrying a reply channel and awaits the answer, or asks the task to close; the
//! task ([`serve`]) answers one batch of its inbox at a time until it is closed or every sender
//! is gone.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

use super::inbox::{Inbox, Queue};
use crate::store::StoreError;

/// Sends the command `make` builds around a reply channel and awaits the answer; a writer that
/// is gone answers `StoreError::Closed`.
pub(crate) async fn ask<C, T>(
    commands: &mpsc::Sender<C>,
    make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> C,
) -> Result<T, StoreError> {
    let (reply, answer) = oneshot::channel();
    commands
        .send(make(reply))
        .await
        .map_err(|_| StoreError::Closed)?;
    answer.await.map_err(|_| StoreError::Closed)?
}

/// Asks the writer to close and waits until it has (or is already gone).
pub(crate) async fn close<C>(
    commands: &mpsc::Sender<C>,
    make: impl FnOnce(oneshot::Sender<()>) -> C,
) {
    let (reply, done) = oneshot::channel();
    if commands.send(make(reply)).await.is_ok() {
        let _ = done.await;
    }
}

/// What a mailbox's task does with its connection: run a batch, and refuse a command once
/// closed.
pub(crate) trait Owner: Send {
    type Command: Send;

    /// Answers every command of `batch` (draining it); returns the reply of a close request.
    fn process(
        &mut self,
        batch: &mut Vec<Self::Command>,
    ) -> impl Future<Output = Option<oneshot::Sender<()>>> + Send;

    /// Answers `command` with `StoreError::Closed` without running it; a close request is handed
    /// back instead.
    fn refuse(command: Self::Command) -> Option<oneshot::Sender<()>>;
}

/// Runs `owner` on `inbox` one batch at a time. A batch holding a close request is answered in
/// full; then what was queued behind it is refused, `owner` (and its connection) is dropped, and
/// only then is the close answered. Returns then, or once every sender is gone.
pub(crate) async fn serve<O, Q>(mut owner: O, mut inbox: Inbox<Q>)
where
    O: Owner,
    Q: Queue<Command = O::Command>,
{
    let mut batch = inbox.empty_batch();
    while inbox.next_batch(&mut batch).await {
        if let Some(close) = owner.process(&mut batch).await {
            // Answer whatever raced in behind the close so no caller waits forever.
            inbox.refuse_rest(|command| {
                if let Some(other_close) = O::refuse(command) {
                    let _ = other_close.send(());
                }
            });
            drop(owner);
            let _ = close.send(());
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Command {
        Echo(u32, oneshot::Sender<Result<u32, StoreError>>),
        Close(oneshot::Sender<()>),
    }

    /// Answers each echo with its value; records its batches; `dropped` is set when it is.
    struct Echo {
        batches: mpsc::UnboundedSender<Vec<u32>>,
        dropped: Option<oneshot::Sender<()>>,
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            if let Some(dropped) = self.dropped.take() {
                let _ = dropped.send(());
            }
        }
    }

    impl Owner for Echo {
        type Command = Command;

        async fn process(&mut self, batch: &mut Vec<Command>) -> Option<oneshot::Sender<()>> {
            let mut close = None;
            let mut seen = Vec::new();
            for command in batch.drain(..) {
                match command {
                    Command::Echo(value, reply) => {
                        seen.push(value);
                        let _ = reply.send(Ok(value));
                    }
                    Command::Close(reply) => close = Some(reply),
                }
            }
            let _ = self.batches.send(seen);
            close
        }

        fn refuse(command: Command) -> Option<oneshot::Sender<()>> {
            match command {
                Command::Echo(_, reply) => {
                    let _ = reply.send(Err(StoreError::Closed));
                    None
                }
                Command::Close(reply) => Some(reply),
            }
        }
    }

    #[tokio::test]
    async fn a_close_answers_its_batch_then_refuses_what_follows_and_drops_the_owner_first() {
        let (commands, receiver) = mpsc::channel(16);
        let (batches, mut seen) = mpsc::unbounded_channel();
        let (dropped, owner_gone) = oneshot::channel();
        let owner = Echo {
            batches,
            dropped: Some(dropped),
        };
        // Queued before the task runs: one batch of three (the limit), then the rest.
        let mut answers = Vec::new();
        for value in 0..2 {
            let (reply, answer) = oneshot::channel();
            commands
                .send(Command::Echo(value, reply))
                .await
                .expect("queued");
            answers.push(answer);
        }
        let (close, closed) = oneshot::channel();
        commands.send(Command::Close(close)).await.expect("queued");
        let (reply, late) = oneshot::channel();
        commands
            .send(Command::Echo(9, reply))
            .await
            .expect("queued");
        let (other_close, other_closed) = oneshot::channel();
        commands
            .send(Command::Close(other_close))
            .await
            .expect("queued");
        let task = tokio::spawn(serve(owner, Inbox::new(receiver, 3)));
        closed.await.expect("the close is answered");
        // The owner was dropped before the close was answered.
        assert!(matches!(owner_gone.await, Ok(())));
        for (value, answer) in (0..2).zip(answers) {
            assert_eq!(answer.await.expect("answered").expect("echoed"), value);
        }
        assert!(matches!(late.await, Ok(Err(StoreError::Closed))));
        assert!(other_closed.await.is_ok());
        task.await.expect("served");
        assert_eq!(seen.recv().await, Some(vec![0, 1]));
        assert_eq!(seen.recv().await, None);
        // Commands sent after the close are refused by the channel: the caller sees `Closed`.
        assert!(matches!(
            ask(&commands, |reply| Command::Echo(10, reply)).await,
            Err(StoreError::Closed)
        ));
    }

    #[tokio::test]
    async fn the_task_ends_once_every_sender_is_gone() {
        let (commands, receiver) = mpsc::channel(16);
        let (batches, mut seen) = mpsc::unbounded_channel();
        let owner = Echo {
            batches,
            dropped: None,
        };
        let task = tokio::spawn(serve(owner, Inbox::new(receiver, 8)));
        assert_eq!(
            ask(&commands, |reply| Command::Echo(5, reply))
                .await
                .expect("echoed"),
            5
        );
        drop(commands);
        task.await.expect("served");
        assert_eq!(seen.recv().await, Some(vec![5]));
        assert_eq!(seen.recv().await, None);
    }
}
