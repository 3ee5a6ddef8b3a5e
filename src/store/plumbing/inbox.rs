//! The receive side of a task's command channel: a batch is the first command to come and what
//! else is queued behind it, up to the batch limit; the channel is done once every sender is gone
//! and nothing is left. Every backend task that takes its commands in batches takes them here.

use std::future::Future;

use tokio::sync::mpsc;

/// The receiving end of a command channel, bounded or not.
pub(crate) trait Queue: Send {
    type Command: Send;

    /// Waits for a command, then moves it and what else is queued, at most `limit`, into
    /// `batch`; 0 once every sender is gone and nothing is left. Cancel-safe.
    fn recv_many(
        &mut self,
        batch: &mut Vec<Self::Command>,
        limit: usize,
    ) -> impl Future<Output = usize> + Send;

    /// A command already queued, without waiting.
    fn try_recv(&mut self) -> Option<Self::Command>;

    /// Refuses later sends; what is queued can still be taken.
    fn close(&mut self);
}

impl<C: Send> Queue for mpsc::Receiver<C> {
    type Command = C;

    fn recv_many(
        &mut self,
        batch: &mut Vec<C>,
        limit: usize,
    ) -> impl Future<Output = usize> + Send {
        mpsc::Receiver::recv_many(self, batch, limit)
    }

    fn try_recv(&mut self) -> Option<C> {
        mpsc::Receiver::try_recv(self).ok()
    }

    fn close(&mut self) {
        mpsc::Receiver::close(self);
    }
}

impl<C: Send> Queue for mpsc::UnboundedReceiver<C> {
    type Command = C;

    fn recv_many(
        &mut self,
        batch: &mut Vec<C>,
        limit: usize,
    ) -> impl Future<Output = usize> + Send {
        mpsc::UnboundedReceiver::recv_many(self, batch, limit)
    }

    fn try_recv(&mut self) -> Option<C> {
        mpsc::UnboundedReceiver::try_recv(self).ok()
    }

    fn close(&mut self) {
        mpsc::UnboundedReceiver::close(self);
    }
}

/// A task's command channel, taken in batches of at most `max_batch` commands.
pub(crate) struct Inbox<Q> {
    queue: Q,
    max_batch: usize,
}

impl<Q: Queue> Inbox<Q> {
    /// Batches of `queue`'s commands, at most `max_batch` (at least one) each.
    pub(crate) fn new(queue: Q, max_batch: usize) -> Inbox<Q> {
        Inbox {
            queue,
            max_batch: max_batch.max(1),
        }
    }

    /// An empty batch to take commands into.
    pub(crate) fn empty_batch(&self) -> Vec<Q::Command> {
        Vec::with_capacity(self.max_batch.min(1024))
    }

    /// Waits for the next command, then takes it and what else is queued behind it, oldest
    /// first, into the empty `batch`, up to the batch limit. `false` once every sender is gone
    /// and nothing is left. Cancel-safe: a wait given up takes nothing.
    pub(crate) async fn next_batch(&mut self, batch: &mut Vec<Q::Command>) -> bool {
        self.queue.recv_many(batch, self.max_batch).await != 0
    }

    /// Tops `batch` up with the commands already queued, oldest first, without waiting, until it
    /// holds the batch limit.
    pub(crate) fn take_queued(&mut self, batch: &mut Vec<Q::Command>) {
        while batch.len() < self.max_batch {
            match self.queue.try_recv() {
                Some(command) => batch.push(command),
                None => break,
            }
        }
    }

    /// Refuses later sends and hands each command still queued to `refuse`, oldest first.
    pub(crate) fn refuse_rest(&mut self, mut refuse: impl FnMut(Q::Command)) {
        self.queue.close();
        while let Some(command) = self.queue.try_recv() {
            refuse(command);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_take_what_is_queued_up_to_the_limit_oldest_first() {
        let (sender, receiver) = mpsc::channel(16);
        let mut inbox = Inbox::new(receiver, 4);
        for value in 0..6u32 {
            sender.send(value).await.expect("queued");
        }
        let mut batch = inbox.empty_batch();
        assert!(inbox.next_batch(&mut batch).await);
        assert_eq!(batch, vec![0, 1, 2, 3]);
        batch.clear();
        assert!(inbox.next_batch(&mut batch).await);
        assert_eq!(batch, vec![4, 5]);
        // A batch topped up without waiting stops at the limit, and at an empty queue.
        for value in 6..12u32 {
            sender.send(value).await.expect("queued");
        }
        inbox.take_queued(&mut batch);
        assert_eq!(batch, vec![4, 5, 6, 7]);
        batch.clear();
        inbox.take_queued(&mut batch);
        assert_eq!(batch, vec![8, 9, 10, 11]);
        batch.clear();
        inbox.take_queued(&mut batch);
        assert!(batch.is_empty());
        // Done once every sender is gone and nothing is left.
        sender.send(12).await.expect("queued");
        drop(sender);
        assert!(inbox.next_batch(&mut batch).await);
        assert_eq!(batch, vec![12]);
        batch.clear();
        assert!(!inbox.next_batch(&mut batch).await);
    }

    #[tokio::test]
    async fn a_limit_of_zero_still_takes_one_command_at_a_time() {
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut inbox = Inbox::new(receiver, 0);
        sender.send(1u32).expect("queued");
        sender.send(2u32).expect("queued");
        let mut batch = inbox.empty_batch();
        assert!(inbox.next_batch(&mut batch).await);
        assert_eq!(batch, vec![1]);
    }

    #[tokio::test]
    async fn refusing_the_rest_hands_back_what_is_queued_and_refuses_later_sends() {
        let (sender, receiver) = mpsc::channel(16);
        let mut inbox = Inbox::new(receiver, 4);
        for value in 0..3u32 {
            sender.send(value).await.expect("queued");
        }
        let mut refused = Vec::new();
        inbox.refuse_rest(|command| refused.push(command));
        assert_eq!(refused, vec![0, 1, 2]);
        assert!(sender.send(3).await.is_err());
        let mut batch = inbox.empty_batch();
        assert!(!inbox.next_batch(&mut batch).await);
    }
}
