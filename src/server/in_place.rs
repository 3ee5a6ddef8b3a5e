//! The connection's service as hyper calls it: the gateway's stack called in place, one stack per
//! connection behind a lock no other connection takes, instead of a clone of the whole stack for
//! every request (what hyper-util's `TowerToHyperService` does).

use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_util::future::Either;
use tower::util::Oneshot;
use tower::{Service, ServiceExt as _};

/// `service`, called by hyper through a shared reference.
pub struct InPlace<S> {
    service: Mutex<S>,
}

impl<S> InPlace<S> {
    pub fn new(service: S) -> InPlace<S> {
        InPlace {
            service: Mutex::new(service),
        }
    }
}

impl<S, R> hyper::service::Service<R> for InPlace<S>
where
    S: Service<R> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Oneshot<S, R>>;

    fn call(&self, request: R) -> Self::Future {
        let mut service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
        // The gateway's layers are always ready, so this is one look. A service that is not
        // (or fails its readiness) is cloned and the clone waits, or fails, on the request's own.
        match service.poll_ready(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(())) => Either::Left(service.call(request)),
            Poll::Ready(Err(_)) | Poll::Pending => Either::Right(service.clone().oneshot(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Ready;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use hyper::service::Service as _;

    use super::*;

    /// Counts its clones; ready only when told.
    struct Counted {
        clones: Arc<AtomicUsize>,
        ready: bool,
    }

    impl Clone for Counted {
        fn clone(&self) -> Counted {
            self.clones.fetch_add(1, Ordering::SeqCst);
            Counted {
                clones: Arc::clone(&self.clones),
                ready: true,
            }
        }
    }

    impl Service<u32> for Counted {
        type Response = u32;
        type Error = ();
        type Future = Ready<Result<u32, ()>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
            if self.ready {
                Poll::Ready(Ok(()))
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }

        fn call(&mut self, request: u32) -> Self::Future {
            std::future::ready(Ok(request * 2))
        }
    }

    #[tokio::test]
    async fn a_ready_service_is_called_without_a_clone_and_one_that_is_not_through_one() {
        let clones = Arc::new(AtomicUsize::new(0));
        let ready = InPlace::new(Counted {
            clones: Arc::clone(&clones),
            ready: true,
        });
        for n in 0..3 {
            assert_eq!(ready.call(n).await, Ok(n * 2));
        }
        assert_eq!(clones.load(Ordering::SeqCst), 0);

        let waiting = InPlace::new(Counted {
            clones: Arc::clone(&clones),
            ready: false,
        });
        assert_eq!(waiting.call(5).await, Ok(10));
        assert_eq!(clones.load(Ordering::SeqCst), 1);
    }
}
