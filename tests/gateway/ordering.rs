//! Serialized generations (I4) on one gateway: one forwarded write per key at a time, in
//! admission order; a request superseded while it waited is refused; waiting is bounded; a
//! timed-out forward keeps its key closed until its upstream connection is gone.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::support;
use crate::support::{send, Behavior, RecordingUpstream, Seen, TestGateway, DELAY_HEADER};

fn route(upstream: &RecordingUpstream, ordering: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"doc\"\npath = \"/doc/{{id}}\"\nupstream = \"{}\"\nresource_key = \"doc:{{id}}\"\ntimeout = \"5s\"\n{extra}\n[routes.fence]\nordering = \"{ordering}\"\n",
        upstream.url()
    )
}

/// Pairs of upstream requests of one target whose handling overlapped in time.
fn overlaps(seen: &[Seen]) -> usize {
    let mut sorted: Vec<&Seen> = seen.iter().collect();
    sorted.sort_by_key(|s| s.arrived);
    sorted
        .windows(2)
        .filter(|pair| pair[1].arrived < pair[0].finished)
        .count()
}

async fn ten_concurrent_writes(gw: &TestGateway) {
    let url = gw.url("/doc/1");
    let writes = (0..10).map(|_| send("PUT", &url, &[("x-fence", "7")], ""));
    let statuses: Vec<u16> = join_all(writes)
        .await
        .iter()
        .map(|r| r.status.as_u16())
        .collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_of_one_key_never_overlap_at_the_upstream() {
    let upstream = RecordingUpstream::start(Behavior::Delay(Duration::from_millis(20))).await;
    let gw = TestGateway::start(&route(&upstream, "serialize", "")).await;
    ten_concurrent_writes(&gw).await;
    let seen = upstream.seen_under("/doc/1");
    assert_eq!(seen.len(), 10);
    assert_eq!(overlaps(&seen), 0, "serialized writes overlapped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_gate_the_same_writes_overlap() {
    let upstream = RecordingUpstream::start(Behavior::Delay(Duration::from_millis(20))).await;
    let gw = TestGateway::start(&route(&upstream, "none", "")).await;
    ten_concurrent_writes(&gw).await;
    assert!(
        overlaps(&upstream.seen_under("/doc/1")) > 0,
        "ordering = none forwards concurrently"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_keys_are_not_held_up_by_a_busy_key() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&route(&upstream, "serialize", "")).await;
    let slow_url = gw.url("/doc/1");
    let slow = tokio::spawn(async move {
        send(
            "PUT",
            &slow_url,
            &[("x-fence", "1"), (DELAY_HEADER, "800")],
            "",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert_eq!(
        send("PUT", &gw.url("/doc/2"), &[("x-fence", "1")], "")
            .await
            .status,
        200
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "key 2 waited for key 1"
    );
    assert_eq!(slow.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_superseded_while_waiting_is_refused_and_never_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&route(&upstream, "serialize", "")).await;
    support::ordering::a_write_queued_behind_a_busy_key_is_superseded(
        gw.url("/doc/1"),
        &upstream,
        Duration::from_millis(100),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_for_a_busy_key_is_bounded_by_gate_timeout() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&route(&upstream, "serialize", "").replace(
        "ordering = \"serialize\"",
        "ordering = \"serialize\"\ngate_timeout = \"200ms\"",
    ))
    .await;
    let slow_url = gw.url("/doc/1");
    let slow = tokio::spawn(async move {
        send(
            "PUT",
            &slow_url,
            &[("x-fence", "1"), (DELAY_HEADER, "1500")],
            "",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let waited = send("PUT", &gw.url("/doc/1"), &[("x-fence", "2")], "").await;
    assert_eq!(waited.status, 503);
    assert_eq!(waited.problem_slug(), "gate-timeout");
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "gave up at the gate timeout"
    );
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(
        upstream.seen().len(),
        1,
        "the request that gave up was never forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_out_forward_keeps_its_key_closed_until_its_connection_is_torn_down() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(
        &route(&upstream, "serialize", "").replace("timeout = \"5s\"", "timeout = \"300ms\""),
    )
    .await;
    let late_url = gw.url("/doc/1");
    let late = tokio::spawn(async move {
        send(
            "PUT",
            &late_url,
            &[("x-fence", "1"), (DELAY_HEADER, "3000")],
            "",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let next = send("PUT", &gw.url("/doc/1"), &[("x-fence", "1")], "").await;
    assert_eq!(late.await.unwrap().status, 504);
    assert_eq!(next.status, 200);
    // The upstream's task for the timed-out connection may see the close after the answer to
    // the next write came back; wait for it (the timing below is kept from the first sighting).
    let deadline = Instant::now() + Duration::from_secs(3);
    while upstream.abandoned().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let abandoned = upstream.abandoned();
    assert_eq!(
        abandoned.len(),
        1,
        "the timed-out request's connection was torn down"
    );
    let next_seen = &upstream.seen_under("/doc/1")[0];
    assert!(
        next_seen.arrived >= abandoned[0].torn_down,
        "the next write reached the upstream before the timed-out one's connection was gone"
    );
}
