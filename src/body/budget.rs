//! The process-wide budget for bodies the gateway holds in memory (`[server]
//! max_buffered_bytes`): idempotent routes' request bodies, captured responses, and serialized
//! responses read ahead. A holder reserves its bytes before it buffers them and gives them back
//! when it drops its [`Reservation`]; a request that finds no room within `buffer_wait` is
//! answered 503 `memory-busy`, so a flood is refused instead of exhausting memory.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget: one semaphore whose permits are bytes.
#[derive(Clone)]
pub struct MemoryBudget {
    bytes: Arc<Semaphore>,
    wait: Duration,
    gauge: IntGauge,
}

/// No room in the budget within the wait.
#[derive(Debug, thiserror::Error)]
#[error("the gateway's buffered-body budget stayed full for {wait:?}")]
pub struct MemoryBusy {
    pub wait: Duration,
}

impl MemoryBudget {
    /// A budget of `bytes` (capped at what a semaphore can count), waited on for at most `wait`.
    pub fn new(bytes: usize, wait: Duration, gauge: IntGauge) -> MemoryBudget {
        MemoryBudget {
            bytes: Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))),
            wait,
            gauge,
        }
    }

    /// An empty reservation, to grow as bytes arrive.
    pub fn empty(&self) -> Reservation {
        Reservation {
            permit: None,
            bytes: 0,
            gauge: self.gauge.clone(),
        }
    }

    /// Adds `bytes` to `reservation`, waiting up to the budget's wait for room.
    pub async fn grow(
        &self,
        reservation: &mut Reservation,
        bytes: usize,
    ) -> Result<(), MemoryBusy> {
        if bytes == 0 {
            return Ok(());
        }
        let count = u32::try_from(bytes).map_err(|_| MemoryBusy { wait: self.wait })?;
        let acquired =
            tokio::time::timeout(self.wait, Arc::clone(&self.bytes).acquire_many_owned(count))
                .await;
        match acquired {
            Ok(Ok(permit)) => {
                reservation.add(permit, bytes);
                Ok(())
            }
            _ => Err(MemoryBusy { wait: self.wait }),
        }
    }

    /// Adds `bytes` to `reservation` if there is room now; false if not.
    pub fn try_grow(&self, reservation: &mut Reservation, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        let Ok(count) = u32::try_from(bytes) else {
            return false;
        };
        match Arc::clone(&self.bytes).try_acquire_many_owned(count) {
            Ok(permit) => {
                reservation.add(permit, bytes);
                true
            }
            Err(_) => false,
        }
    }
}

/// Bytes held under the budget until this is dropped.
#[derive(Debug)]
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    gauge: IntGauge,
}

impl Reservation {
    fn add(&mut self, permit: OwnedSemaphorePermit, bytes: usize) {
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        self.bytes += bytes;
        self.gauge.add(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.gauge
            .sub(i64::try_from(self.bytes).unwrap_or(i64::MAX));
    }
}

pin_project_lite::pin_project! {
    /// A body whose bytes are held under the budget: the reservation is given back when the
    /// body is dropped.
    pub struct Budgeted<B> {
        #[pin]
        inner: B,
        reservation: Reservation,
    }
}

impl<B> Budgeted<B> {
    pub fn new(inner: B, reservation: Reservation) -> Budgeted<B> {
        Budgeted { inner, reservation }
    }
}

impl<B: http_body::Body> http_body::Body for Budgeted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(bytes: usize) -> MemoryBudget {
        let gauge = IntGauge::new("test_buffered", "test").expect("gauge");
        MemoryBudget::new(bytes, Duration::from_millis(20), gauge)
    }

    #[tokio::test]
    async fn a_reservation_holds_its_bytes_until_dropped() {
        let budget = budget(100);
        let mut first = budget.empty();
        budget.grow(&mut first, 60).await.expect("room");
        budget.grow(&mut first, 30).await.expect("room");
        assert_eq!(first.bytes(), 90);
        let mut second = budget.empty();
        assert!(budget.grow(&mut second, 20).await.is_err());
        assert!(!budget.try_grow(&mut second, 20));
        assert_eq!(budget.gauge.get(), 90);
        drop(first);
        assert_eq!(budget.gauge.get(), 0);
        assert!(budget.try_grow(&mut second, 100));
    }

    #[tokio::test]
    async fn a_waiting_reservation_gets_room_freed_within_the_wait() {
        let budget = MemoryBudget::new(
            10,
            Duration::from_secs(5),
            IntGauge::new("test_buffered_wait", "test").expect("gauge"),
        );
        let mut held = budget.empty();
        budget.grow(&mut held, 10).await.expect("room");
        let waiter = {
            let budget = budget.clone();
            tokio::spawn(async move {
                let mut mine = budget.empty();
                budget.grow(&mut mine, 5).await.map(|()| mine.bytes())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        assert_eq!(waiter.await.expect("joined").expect("room"), 5);
    }
}
