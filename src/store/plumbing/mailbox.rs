//! The request/reply plumbing of a backend whose connection is owned by a writer task (Redis):
//! send a command carrying a reply channel, await the answer, and close.

use tokio::sync::{mpsc, oneshot};

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
