//! The writers of a store, one per serving thread, and how a request reaches the calling
//! thread's writer.

use redis::Cmd;
use tokio::sync::{mpsc, oneshot};

use super::command::Command;
use super::writer::WriterTemplate;
use crate::store::plumbing::mailbox;
use crate::store::plumbing::per_thread::PerThread;
use crate::store::StoreError;

/// The writer of each serving thread, shared by the store and its key turns.
pub(super) struct WriterPool {
    pub(super) writers: PerThread<mpsc::Sender<Command>>,
    /// What a new writer is made from.
    pub(super) template: WriterTemplate,
}

impl WriterPool {
    pub(super) async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let writer = self.writers.queue(|| self.template.spawn(None))?;
        mailbox::ask(&writer, make).await
    }

    /// Queues `commands` for the calling thread's next pipeline without waiting for them; their
    /// answers are dropped. `false` if they could not be queued.
    pub(super) fn forget(&self, commands: Vec<Cmd>) -> bool {
        self.writers
            .queue(|| self.template.spawn(None))
            .is_ok_and(|writer| writer.try_send(Command::Forget { commands }).is_ok())
    }
}
