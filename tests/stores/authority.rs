//! `[routes.fence.authority]` against real lock services: an etcd lock taken as etcd's recipe
//! takes it, and the PostgreSQL lease table. A grant raises the key's mark before the holder
//! writes; an ended lease refuses its holder's token at once; `require_live_lease` refuses
//! tokens that are not the holder's; a lock service the gateway cannot follow fails the route
//! closed (or, by choice, back to the marks alone).

use std::time::{Duration, Instant};

use crate::support::etcd::{delete_keys, unique_prefix, ETCD_ADDR};
use crate::support::locks::{etcd_contend, etcd_revoke, LeaseTable};
use crate::support::postgres::TEST_POSTGRES_URL;
use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::{send, TestGateway};

const ADMIN_TOKEN: &str = "authority-test-token";
/// Longest wait for the watch to report a change.
const FOLLOW_WAIT: Duration = Duration::from_secs(10);

pub(super) fn route(upstream: &str, name: &str, authority: &str) -> String {
    format!(
        r#"
[[routes]]
name = "{name}"
path = "/{name}/{{id}}"
upstream = "{upstream}"
resource_key = "{name}:{{id}}"

[routes.fence]
ordering = "none"

[routes.fence.authority]
{authority}
"#
    )
}

fn etcd_authority(prefix: &str, extra: &str) -> String {
    format!(
        "kind = \"etcd\"\nendpoints = [\"http://{ETCD_ADDR}\"]\nlock_key = \"{prefix}locks/{{id}}\"\n{extra}\n"
    )
}

/// Waits until `key`'s mark is `want`.
async fn until_mark(gateway: &TestGateway, key: &str, want: u64) {
    until_mark_within(gateway, key, want, FOLLOW_WAIT).await;
}

/// Waits until `key`'s mark is `want`, up to `within`.
pub(super) async fn until_mark_within(
    gateway: &TestGateway,
    key: &str,
    want: u64,
    within: Duration,
) {
    let started = Instant::now();
    loop {
        let mark = gateway.store().current(key).await.expect("store answers");
        if mark == Some(want) {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{key}: mark {mark:?}, expected {want} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `GET /admin/authorities` with the admin token.
pub(super) async fn authorities(gateway: &TestGateway, admin_token: &str) -> serde_json::Value {
    send(
        "GET",
        &gateway.admin_url("/admin/authorities"),
        &[("authorization", &format!("Bearer {admin_token}"))],
        "",
    )
    .await
    .json()
}

pub(super) async fn write(gateway: &TestGateway, path: &str, token: u64) -> (u16, String) {
    let reply = send(
        "PUT",
        &gateway.url(path),
        &[("x-fence", &token.to_string())],
        "x",
    )
    .await;
    let slug = if reply.status.is_success() {
        String::new()
    } else {
        reply.problem_slug()
    };
    (reply.status.as_u16(), slug)
}

#[tokio::test]
async fn an_etcd_grant_raises_the_mark_and_an_ended_lease_refuses_its_holder() {
    let prefix = unique_prefix();
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gateway =
        TestGateway::start(&route(&upstream.url(), "inv", &etcd_authority(&prefix, ""))).await;
    let lock = format!("{prefix}locks/7");

    let first = etcd_contend(&lock, 30).await;
    // The holder has not written: the watch raised the mark to its token.
    until_mark(&gateway, "inv:7", first.token).await;
    assert_eq!(write(&gateway, "/inv/7", first.token).await.0, 200);
    // Below the holder's: a lease that ended before this one was granted.
    assert_eq!(
        write(&gateway, "/inv/7", first.token - 1).await,
        (409, "lease-ended".to_owned())
    );

    // A second contender waits behind the first; the first's lease ends: the lock passes on,
    // and the mark with it, before the new holder writes.
    let second = etcd_contend(&lock, 30).await;
    etcd_revoke(first.lease).await;
    until_mark(&gateway, "inv:7", second.token).await;
    assert_eq!(
        write(&gateway, "/inv/7", first.token).await.0,
        409,
        "the zombie is refused"
    );

    // The lease ends with no one waiting: the ended holder's token is refused at once, before
    // anyone else takes the lock.
    etcd_revoke(second.lease).await;
    until_mark(&gateway, "inv:7", second.token + 1).await;
    assert_eq!(write(&gateway, "/inv/7", second.token).await.0, 409);

    let third = etcd_contend(&lock, 30).await;
    until_mark(&gateway, "inv:7", third.token).await;
    assert_eq!(write(&gateway, "/inv/7", third.token).await.0, 200);
    let forwarded: Vec<u64> = upstream.seen().iter().filter_map(|s| s.fence()).collect();
    assert_eq!(forwarded, vec![first.token, third.token]);

    etcd_revoke(third.lease).await;
    gateway.stop().await;
    delete_keys(&prefix).await;
}

#[tokio::test]
async fn require_live_lease_refuses_every_token_but_the_holders() {
    for strict in [false, true] {
        let prefix = unique_prefix();
        let upstream = RecordingUpstream::start(Behavior::Ok).await;
        let extra = format!("require_live_lease = true\nstrict = {strict}");
        let gateway = TestGateway::start(&route(
            &upstream.url(),
            "doc",
            &etcd_authority(&prefix, &extra),
        ))
        .await;
        let holder = etcd_contend(&format!("{prefix}locks/1"), 30).await;
        until_mark(&gateway, "doc:1", holder.token).await;
        assert_eq!(
            write(&gateway, "/doc/1", holder.token).await.0,
            200,
            "strict = {strict}"
        );
        // Above the holder's token: a future grant the watch has not seen, or a made-up token;
        // a linearizable read says which.
        assert_eq!(
            write(&gateway, "/doc/1", holder.token + 1000).await,
            (409, "lease-ended".to_owned()),
            "strict = {strict}"
        );
        // A lock no one holds: no token is live.
        assert_eq!(
            write(&gateway, "/doc/2", 5).await,
            (409, "lease-ended".to_owned()),
            "strict = {strict}"
        );
        etcd_revoke(holder.lease).await;
        let started = Instant::now();
        loop {
            let (status, slug) = write(&gateway, "/doc/1", holder.token).await;
            if status == 409 {
                assert_eq!(slug, "lease-ended");
                break;
            }
            assert!(
                !strict,
                "strict confirms the lease: {status} after the revoke"
            );
            assert!(started.elapsed() < FOLLOW_WAIT, "the end was never seen");
        }
        let forwarded: Vec<u64> = upstream.seen().iter().filter_map(|s| s.fence()).collect();
        assert!(
            forwarded.iter().all(|t| *t == holder.token),
            "only the holder's token was forwarded: {forwarded:?}"
        );
        gateway.stop().await;
        delete_keys(&prefix).await;
    }
}

#[tokio::test]
async fn a_lock_service_out_of_reach_fails_the_route_closed_or_back_to_the_marks() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    // Nothing listens on port 1.
    let unreachable = |extra: &str| {
        format!("kind = \"etcd\"\nendpoints = [\"http://127.0.0.1:1\"]\nlock_key = \"locks/{{id}}\"\nrequest_timeout = \"200ms\"\n{extra}\n")
    };
    let routes = format!(
        "{}{}",
        route(&upstream.url(), "closed", &unreachable("")),
        route(
            &upstream.url(),
            "plain",
            &unreachable("on_unavailable = \"plain\"")
        )
    );
    let gateway = TestGateway::builder(&routes)
        .admin(ADMIN_TOKEN)
        .start()
        .await;
    assert_eq!(
        write(&gateway, "/closed/1", 3).await,
        (503, "authority-unavailable".to_owned())
    );
    assert_eq!(write(&gateway, "/plain/1", 3).await.0, 200);
    assert_eq!(
        write(&gateway, "/plain/1", 2).await,
        (409, "stale-fence".to_owned()),
        "the marks still hold"
    );
    let ready = send("GET", &gateway.admin_url("/readyz"), &[], "").await;
    assert_eq!(ready.status, 503);
    let why = String::from_utf8_lossy(&ready.body);
    assert!(why.contains("closed"), "{why}");
    let listed = authorities(&gateway, ADMIN_TOKEN).await;
    let closed = listed["authorities"]
        .as_array()
        .and_then(|all| all.iter().find(|a| a["route"] == "closed"))
        .cloned()
        .expect("the closed route's authority");
    assert_eq!(closed["in_sync"], false);
    assert!(
        closed["error"]
            .as_str()
            .is_some_and(|e| e.contains("127.0.0.1:1")),
        "{closed}"
    );
    let metrics = send("GET", &gateway.admin_url("/metrics"), &[], "")
        .await
        .body;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("fencegate_authority_up{route=\"closed\"} 0"),
        "{metrics}"
    );
    assert!(metrics
        .contains("fencegate_authority_checks_total{outcome=\"unavailable\",route=\"closed\"} 1"));
    gateway.stop().await;
}

#[tokio::test]
async fn a_postgres_lease_table_moves_the_marks_on_grants_and_expiries() {
    let leases = LeaseTable::create().await;
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let authority = format!(
        "kind = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\ntable = \"{}\"\nlock_key = \"job:{{id}}\"\npoll_interval = \"20ms\"\nrequire_live_lease = true\n",
        leases.table
    );
    let gateway = TestGateway::start(&route(&upstream.url(), "job", &authority)).await;

    let first = leases
        .acquire("job:4", "a", Duration::from_millis(600))
        .await
        .expect("a free lock");
    until_mark(&gateway, "job:4", first).await;
    assert_eq!(write(&gateway, "/job/4", first).await.0, 200);
    assert_eq!(
        write(&gateway, "/job/4", first + 1).await,
        (409, "lease-ended".to_owned()),
        "not the holder's token"
    );
    // The lease expires by the database's clock: the mark moves past it.
    until_mark(&gateway, "job:4", first + 1).await;
    assert_eq!(write(&gateway, "/job/4", first).await.0, 409);

    let second = leases
        .acquire("job:4", "b", Duration::from_secs(30))
        .await
        .expect("the expired lock is free");
    assert_eq!(second, first + 1);
    until_mark(&gateway, "job:4", second).await;
    assert_eq!(write(&gateway, "/job/4", second).await.0, 200);
    leases.release("job:4", second).await;
    let started = Instant::now();
    while write(&gateway, "/job/4", second).await.0 != 409 {
        assert!(
            started.elapsed() < FOLLOW_WAIT,
            "the release was never seen"
        );
    }
    let forwarded: Vec<u64> = upstream.seen().iter().filter_map(|s| s.fence()).collect();
    assert_eq!(&forwarded[..2], &[first, second]);
    gateway.stop().await;
    leases.drop().await;
}
