//! Runs one served connection under its clock: the connection's own future, raced against a
//! tick that asks the [`ConnectionClock`] whether the connection has overstayed its state, in
//! which case the connection (and every request on it) is dropped.

use std::future::Future;
use std::sync::Arc;

use prometheus::IntCounterVec;

use super::activity::ConnectionActivity;
use super::clock::{ConnectionClock, ConnectionTimeouts, Expiry};

/// Drives `connection` to its end, or until its clock expires it (counted in `closed` under
/// `listener` and the reason). Returns the connection's own result, or the expiry.
pub async fn drive<F, E>(
    connection: F,
    activity: Arc<ConnectionActivity>,
    timeouts: ConnectionTimeouts,
    closed: &IntCounterVec,
    listener: &str,
) -> Result<Result<(), E>, Expiry>
where
    F: Future<Output = Result<(), E>>,
{
    let mut clock = ConnectionClock::new(timeouts);
    let tick = timeouts.tick();
    tokio::pin!(connection);
    let sleep = tokio::time::sleep(tick);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            biased;
            ended = &mut connection => return Ok(ended),
            () = &mut sleep => {
                if let Some(expiry) = clock.check(activity.snapshot()) {
                    closed.with_label_values(&[listener, expiry.label()]).inc();
                    return Err(expiry);
                }
                sleep.as_mut().reset(tokio::time::Instant::now() + tick);
            }
        }
    }
}
