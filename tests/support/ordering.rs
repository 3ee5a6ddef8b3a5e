//! Scenarios of serialized routes that more than one backend's tests run.

use std::time::Duration;

use super::{send, RecordingUpstream, Seen, DELAY_HEADER};

/// Three writes of one key through `url`, `gap` apart: A (token 5) holds the key for four gaps at
/// the upstream; B (token 5, so admitted) queues behind it; C (token 6) arrives while B waits.
/// B must be refused as superseded and never forwarded; A and C pass, in that order.
pub async fn a_write_queued_behind_a_busy_key_is_superseded(
    url: String,
    upstream: &RecordingUpstream,
    gap: Duration,
) {
    let hold = (gap * 4).as_millis().to_string();
    let (a_url, b_url, c_url) = (url.clone(), url.clone(), url);
    let a = tokio::spawn(async move {
        send(
            "PUT",
            &a_url,
            &[("x-fence", "5"), (DELAY_HEADER, &hold)],
            "a",
        )
        .await
    });
    tokio::time::sleep(gap).await;
    let b = tokio::spawn(async move { send("PUT", &b_url, &[("x-fence", "5")], "b").await });
    tokio::time::sleep(gap).await;
    let c = tokio::spawn(async move { send("PUT", &c_url, &[("x-fence", "6")], "c").await });
    let (a, b, c) = (a.await.unwrap(), b.await.unwrap(), c.await.unwrap());
    assert_eq!(a.status, 200);
    assert_eq!(
        b.status, 409,
        "B was overtaken by a newer generation while it waited"
    );
    assert_eq!(b.problem_slug(), "stale-fence");
    assert_eq!(b.header("x-fence-current"), Some("6"));
    assert_eq!(c.status, 200);
    let tokens: Vec<Option<u64>> = upstream.seen().iter().map(Seen::fence).collect();
    assert_eq!(tokens, [Some(5), Some(6)]);
}
