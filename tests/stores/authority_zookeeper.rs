//! `kind = "zookeeper"` against the real ZooKeeper of scripts/zookeeper-setup.sh, with contenders
//! named as the plain recipe and Curator name them: grants, expired sessions and releases, both
//! tokens, `require_live_lease` and `strict`, broken sessions, ACLs, and lock nodes made again.

use std::time::{Duration, Instant};

use super::authority::{authorities, route, until_mark_within, write};
use crate::support::relay::{Relay, RelayMode};
use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::zookeeper::{
    unique_root, zk_contend, zk_contend_as, zk_delete_tree, zk_observer, zk_observer_as, Naming,
    ZK_HOSTS,
};
use crate::support::{send, TestGateway};

const ADMIN_TOKEN: &str = "zookeeper-authority-test";
/// A contender's session: ZooKeeper's minimum (two ticks of 2 s), so a paused holder's ends soon.
const CONTENDER_SESSION: Duration = Duration::from_secs(4);
/// Longest wait for the watch: a session's expiry plus the server's tick and the watch.
const FOLLOW_WAIT: Duration = Duration::from_secs(20);

fn zk_authority(root: &str, extra: &str) -> String {
    format!("kind = \"zookeeper\"\nhosts = \"{ZK_HOSTS}\"\nlock_key = \"{root}/locks/{{id}}\"\n{extra}\n")
}

/// Makes the lock node and moves its counter past 0, so that tokens start at 1.
async fn lock_node(lock: &str) {
    zk_contend(lock, Naming::Plain, CONTENDER_SESSION)
        .await
        .release()
        .await;
}

#[tokio::test]
async fn a_zookeeper_grant_raises_the_mark_and_an_expired_session_refuses_its_holder() {
    for naming in [Naming::Curator, Naming::Plain] {
        let root = unique_root();
        let upstream = RecordingUpstream::start(Behavior::Ok).await;
        let gateway =
            TestGateway::builder(&route(&upstream.url(), "inv", &zk_authority(&root, "")))
                .admin(ADMIN_TOKEN)
                .start()
                .await;
        let lock = format!("{root}/locks/7");
        lock_node(&lock).await;

        let first = zk_contend(&lock, naming, CONTENDER_SESSION).await;
        // The holder has not written: the watch raised the mark to its token.
        until_mark_within(&gateway, "inv:7", first.token, FOLLOW_WAIT).await;
        operations_surface_shows_a_followed_lock(&gateway).await;
        assert_eq!(
            write(&gateway, "/inv/7", first.token).await.0,
            200,
            "{naming:?}"
        );
        assert_eq!(
            write(&gateway, "/inv/7", first.token - 1).await,
            (409, "lease-ended".to_owned()),
            "{naming:?}: below the holder's token"
        );

        // A second contender waits behind the first, which pauses past its session: ZooKeeper
        // deletes its node, the lock passes on, and the mark with it, before the new holder writes.
        let second = zk_contend(&lock, naming, CONTENDER_SESSION).await;
        let zombie = first.token;
        first.pause();
        until_mark_within(&gateway, "inv:7", second.token, FOLLOW_WAIT).await;
        assert_eq!(
            write(&gateway, "/inv/7", zombie).await,
            (409, "lease-ended".to_owned()),
            "{naming:?}: the zombie is refused"
        );

        // A release with no one waiting: the ended holder's token is refused at once.
        let released = second.token;
        second.release().await;
        until_mark_within(&gateway, "inv:7", released + 1, FOLLOW_WAIT).await;
        assert_eq!(
            write(&gateway, "/inv/7", released).await.0,
            409,
            "{naming:?}"
        );

        let forwarded: Vec<u64> = upstream.seen().iter().filter_map(|s| s.fence()).collect();
        assert_eq!(forwarded, vec![zombie], "{naming:?}");
        gateway.stop().await;
        zk_delete_tree(&zk_observer().await, &root).await;
    }
}

/// `/admin/authorities`, `/readyz` and the metrics of a route whose ZooKeeper lock has a holder.
async fn operations_surface_shows_a_followed_lock(gateway: &TestGateway) {
    // The mark alone does not say the grant was seen: the throwaway contender's end raised it to
    // the next sequence number already, which is the holder's.
    let started = Instant::now();
    let listed = loop {
        let listed = authorities(gateway, ADMIN_TOKEN).await;
        if listed["authorities"][0]["holders"] == 1 || started.elapsed() > FOLLOW_WAIT {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let authority = &listed["authorities"][0];
    assert_eq!(authority["kind"], "zookeeper", "{listed}");
    assert_eq!(authority["in_sync"], true, "{listed}");
    assert_eq!(authority["holders"], 1, "{listed}");
    assert!(
        authority["revision"].as_i64().is_some_and(|r| r > 0),
        "a zxid: {listed}"
    );
    let ready = send("GET", &gateway.admin_url("/readyz"), &[], "").await;
    assert_eq!(
        ready.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&ready.body)
    );
    let metrics = send("GET", &gateway.admin_url("/metrics"), &[], "")
        .await
        .body;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("fencegate_authority_up{route=\"inv\"} 1"),
        "{metrics}"
    );
    // The holder's grant, and the throwaway contender's too when the watch saw it before it went.
    let grants: u64 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("fencegate_authority_events_total{event=\"grant\",route=\"inv\"} ")
        })
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(grants >= 1, "{metrics}");
}

#[tokio::test]
async fn require_live_lease_on_zookeeper_refuses_every_token_but_the_holders() {
    for (strict, token) in [(false, "sequence"), (true, "sequence"), (true, "czxid")] {
        let root = unique_root();
        let upstream = RecordingUpstream::start(Behavior::Ok).await;
        let extra = format!("require_live_lease = true\nstrict = {strict}\ntoken = \"{token}\"");
        let gateway =
            TestGateway::start(&route(&upstream.url(), "doc", &zk_authority(&root, &extra))).await;
        let case = format!("strict = {strict}, token = {token}");
        let lock = format!("{root}/locks/1");
        lock_node(&lock).await;
        let holder = zk_contend(&lock, Naming::Curator, CONTENDER_SESSION).await;
        let live = if token == "czxid" {
            holder.czxid
        } else {
            holder.token
        };
        until_mark_within(&gateway, "doc:1", live, FOLLOW_WAIT).await;
        assert_eq!(write(&gateway, "/doc/1", live).await.0, 200, "{case}");
        // Above the holder's token: a grant the watch has not seen, or a made-up token.
        assert_eq!(
            write(&gateway, "/doc/1", live + 1000).await,
            (409, "lease-ended".to_owned()),
            "{case}"
        );
        // A lock no one holds (its node does not even exist): no token is live.
        assert_eq!(
            write(&gateway, "/doc/2", 5).await,
            (409, "lease-ended".to_owned()),
            "{case}"
        );
        holder.release().await;
        if strict {
            // The confirm reads ZooKeeper after a sync: refused from the release on.
            assert_eq!(
                write(&gateway, "/doc/1", live).await,
                (409, "lease-ended".to_owned()),
                "{case}: strict confirms the lease"
            );
        } else {
            until_answered(&gateway, "/doc/1", live, (409, "lease-ended")).await;
        }
        // Without strict, writes sent before the watch saw the release still pass: the holder's.
        let forwarded: Vec<u64> = upstream.seen().iter().filter_map(|s| s.fence()).collect();
        assert!(
            !forwarded.is_empty() && forwarded.iter().all(|t| *t == live),
            "{case}: only the holder's token was forwarded: {forwarded:?}"
        );
        if strict {
            assert_eq!(forwarded, vec![live], "{case}");
        }
        gateway.stop().await;
        zk_delete_tree(&zk_observer().await, &root).await;
    }
}

#[tokio::test]
async fn a_zookeeper_ensemble_out_of_reach_fails_the_route_closed() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    // Nothing listens on port 1.
    let authority = "kind = \"zookeeper\"\nhosts = \"127.0.0.1:1\"\nlock_key = \"/locks/{id}\"\nrequest_timeout = \"200ms\"\nsession_timeout = \"1s\"\n";
    let gateway = TestGateway::builder(&route(&upstream.url(), "closed", authority))
        .admin(ADMIN_TOKEN)
        .start()
        .await;
    assert_eq!(
        write(&gateway, "/closed/1", 3).await,
        (503, "authority-unavailable".to_owned())
    );
    let ready = send("GET", &gateway.admin_url("/readyz"), &[], "").await;
    assert_eq!(ready.status, 503);
    // Not only "not read yet": the route says it could not connect.
    let listed = until_authority(&gateway, "closed", |a| {
        a["error"]
            .as_str()
            .is_some_and(|e| e.contains("connecting to ZooKeeper (127.0.0.1:1)"))
    })
    .await;
    assert_eq!(listed["kind"], "zookeeper", "{listed}");
    assert_eq!(listed["in_sync"], false, "{listed}");
    assert_eq!(
        write(&gateway, "/closed/1", 3).await,
        (503, "authority-unavailable".to_owned())
    );
    assert!(upstream.seen().is_empty(), "nothing was forwarded");
    gateway.stop().await;
}

/// Route `name`'s entry of `/admin/authorities` once `ready` holds for it, within FOLLOW_WAIT.
async fn until_authority(
    gateway: &TestGateway,
    name: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let listed = authorities(gateway, ADMIN_TOKEN).await;
        let entry = listed["authorities"]
            .as_array()
            .and_then(|all| all.iter().find(|a| a["route"] == name))
            .cloned()
            .unwrap_or_default();
        if ready(&entry) {
            return entry;
        }
        assert!(
            started.elapsed() < FOLLOW_WAIT,
            "{name}: not as expected within {FOLLOW_WAIT:?}: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes with `token` until the gateway answers `want` (status, problem slug).
async fn until_answered(gateway: &TestGateway, path: &str, token: u64, want: (u16, &str)) {
    let started = Instant::now();
    loop {
        let (status, slug) = write(gateway, path, token).await;
        if (status, slug.as_str()) == want {
            return;
        }
        assert!(
            started.elapsed() < FOLLOW_WAIT,
            "{path} with {token}: {status} {slug}, expected {want:?} within {FOLLOW_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gateway following lock `{root}/locks/3` through a relay to ZooKeeper, so that a test can
/// break the connection, with a session of 30 s (above FOLLOW_WAIT: only the gateway noticing the
/// break itself can take the route out of sync in time); the lock's holder has written once.
struct Relayed {
    root: String,
    relay: Relay,
    upstream: RecordingUpstream,
    gateway: TestGateway,
    lock: String,
    holder: crate::support::zookeeper::ZkContender,
}

impl Relayed {
    async fn start(request_timeout: &str) -> Relayed {
        let root = unique_root();
        let relay = Relay::start(ZK_HOSTS.parse().expect("ZooKeeper's address")).await;
        let upstream = RecordingUpstream::start(Behavior::Ok).await;
        let authority = format!(
            "kind = \"zookeeper\"\nhosts = \"{}\"\nlock_key = \"{root}/locks/{{id}}\"\nrequest_timeout = \"{request_timeout}\"\nsession_timeout = \"30s\"\n",
            relay.addr
        );
        let gateway = TestGateway::start(&route(&upstream.url(), "inv", &authority)).await;
        let lock = format!("{root}/locks/3");
        lock_node(&lock).await;
        let holder = zk_contend(&lock, Naming::Curator, CONTENDER_SESSION).await;
        until_answered(&gateway, "/inv/3", holder.token, (200, "")).await;
        // Quiet: no read of the gateway's is in flight when the connection breaks, so only the
        // session's own report of it can take the route out of sync.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Relayed {
            root,
            relay,
            upstream,
            gateway,
            lock,
            holder,
        }
    }

    async fn stop(self) {
        self.holder.release().await;
        self.gateway.stop().await;
        zk_delete_tree(&zk_observer().await, &self.root).await;
    }
}

#[tokio::test]
async fn a_broken_zookeeper_session_fails_closed_until_a_new_one_has_read_every_lock() {
    let mut relayed = Relayed::start("500ms").await;
    let zombie = relayed.holder.token;

    // The gateway loses ZooKeeper: its route fails closed rather than judge by a stale view, at
    // once, not when its session would expire.
    relayed.relay.set(RelayMode::Cut);
    until_answered(
        &relayed.gateway,
        "/inv/3",
        zombie,
        (503, "authority-unavailable"),
    )
    .await;
    // Meanwhile the lock changes hands, unseen by the gateway.
    let second = zk_contend(&relayed.lock, Naming::Curator, CONTENDER_SESSION).await;
    std::mem::replace(&mut relayed.holder, second)
        .release()
        .await;

    // Back: a new session reads the lock again before the route trusts its view.
    relayed.relay.set(RelayMode::Pass);
    let gateway = &relayed.gateway;
    until_answered(gateway, "/inv/3", relayed.holder.token, (200, "")).await;
    assert_eq!(
        write(gateway, "/inv/3", zombie).await,
        (409, "lease-ended".to_owned()),
        "the holder that released while the gateway was away"
    );
    let forwarded: Vec<u64> = relayed
        .upstream
        .seen()
        .iter()
        .filter_map(|s| s.fence())
        .collect();
    assert!(
        forwarded
            .iter()
            .all(|t| *t == zombie || *t == relayed.holder.token)
            && forwarded.last() == Some(&relayed.holder.token),
        "{forwarded:?}"
    );
    relayed.stop().await;
}

#[tokio::test]
async fn locks_behind_a_digest_acl_are_read_with_the_routes_credentials() {
    const DIGEST: &str = "fencegate-test:s3cret";
    let root = unique_root();
    let lock = format!("{root}/locks/5");
    // Every node from the root down is readable by that user alone.
    let holder = zk_contend_as(&lock, Naming::Curator, CONTENDER_SESSION, Some(DIGEST)).await;
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let password = secrets.path().join("zk-password");
    std::fs::write(&password, "s3cret").expect("write the password file");
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let with = zk_authority(
        &root,
        &format!(
            "require_live_lease = true\nusername = \"fencegate-test\"\npassword_file = \"{}\"",
            password.display()
        ),
    );
    let without = zk_authority(
        &root,
        "require_live_lease = true\nrequest_timeout = \"500ms\"",
    );
    let routes = format!(
        "{}{}",
        route(&upstream.url(), "with", &with),
        route(&upstream.url(), "without", &without)
    );
    let gateway = TestGateway::builder(&routes)
        .admin(ADMIN_TOKEN)
        .start()
        .await;
    until_answered(&gateway, "/with/5", holder.token, (200, "")).await;
    until_answered(
        &gateway,
        "/without/5",
        holder.token,
        (503, "authority-unavailable"),
    )
    .await;
    // Refused by ZooKeeper, not merely not read yet.
    let without = until_authority(&gateway, "without", |a| {
        a["error"]
            .as_str()
            .is_some_and(|e| e.contains("not authorized"))
    })
    .await;
    assert_eq!(without["in_sync"], false, "{without}");
    let forwarded: Vec<u64> = upstream.seen().iter().filter_map(|s| s.fence()).collect();
    assert_eq!(forwarded, vec![holder.token]);
    holder.release().await;
    gateway.stop().await;
    zk_delete_tree(&zk_observer_as(DIGEST).await, &root).await;
}

#[tokio::test]
async fn locks_made_after_the_gateway_started_below_a_root_that_did_not_exist_are_followed() {
    // Two levels of placeholders: the watch's root is `{root}/t`, which does not exist yet.
    let root = unique_root();
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let authority = format!(
        "kind = \"zookeeper\"\nhosts = \"{ZK_HOSTS}\"\nlock_key = \"{root}/t/{{tenant}}/{{id}}\"\nresource_key = \"acct:{{tenant}}:{{id}}\"\nrequire_live_lease = true\n"
    );
    let routes = format!(
        r#"
[[routes]]
name = "acct"
path = "/acct/{{tenant}}/{{id}}"
upstream = "{}"
resource_key = "acct:{{tenant}}:{{id}}"

[routes.fence]
ordering = "none"

[routes.fence.authority]
{authority}
"#,
        upstream.url()
    );
    let gateway = TestGateway::builder(&routes)
        .admin(ADMIN_TOKEN)
        .start()
        .await;
    until_authority(&gateway, "acct", |a| a["in_sync"] == true).await;
    let lock = format!("{root}/t/blue/9");
    lock_node(&lock).await;
    let holder = zk_contend(&lock, Naming::Plain, CONTENDER_SESSION).await;
    // Seen by the watch, not only confirmed: the holder is in the view.
    until_authority(&gateway, "acct", |a| a["holders"] == 1).await;
    until_answered(&gateway, "/acct/blue/9", holder.token, (200, "")).await;
    assert_eq!(
        write(&gateway, "/acct/blue/9", holder.token + 1).await,
        (409, "lease-ended".to_owned())
    );
    holder.release().await;
    until_authority(&gateway, "acct", |a| a["holders"] == 0).await;
    gateway.stop().await;
    zk_delete_tree(&zk_observer().await, &root).await;
}

#[tokio::test]
async fn a_lock_node_made_again_restarts_sequence_tokens_but_not_czxid_tokens() {
    for token in ["sequence", "czxid"] {
        let root = unique_root();
        let upstream = RecordingUpstream::start(Behavior::Ok).await;
        let gateway = TestGateway::start(&route(
            &upstream.url(),
            "doc",
            &zk_authority(&root, &format!("token = \"{token}\"")),
        ))
        .await;
        let lock = format!("{root}/locks/4");
        let token_of = |c: &crate::support::zookeeper::ZkContender| {
            if token == "czxid" {
                c.czxid
            } else {
                c.token
            }
        };
        // Three grants, then the lock node is deleted (as ZooKeeper deletes a container) and made
        // again: its counter starts at 0.
        for _ in 0..3 {
            zk_contend(&lock, Naming::Curator, CONTENDER_SESSION)
                .await
                .release()
                .await;
        }
        let before = zk_contend(&lock, Naming::Curator, CONTENDER_SESSION).await;
        let first = token_of(&before);
        until_answered(&gateway, "/doc/4", first, (200, "")).await;
        before.release().await;
        zk_delete_tree(&zk_observer().await, &lock).await;
        let after = zk_contend(&lock, Naming::Curator, CONTENDER_SESSION).await;
        let second = token_of(&after);
        if token == "czxid" {
            // Ensemble-wide: the new holder's token is above the old, and it writes.
            assert!(second > first, "czxid {second} after {first}");
            until_answered(&gateway, "/doc/4", second, (200, "")).await;
        } else {
            // The counter started again: the new holder's token is below the mark, refused.
            assert!(second < first, "sequence {second} after {first}");
            let (status, slug) = write(&gateway, "/doc/4", second).await;
            assert_eq!((status, slug.as_str()), (409, "stale-fence"), "{token}");
        }
        after.release().await;
        gateway.stop().await;
        zk_delete_tree(&zk_observer().await, &root).await;
    }
}

#[tokio::test]
async fn a_stalled_zookeeper_connection_fails_the_route_closed_before_its_session_would_expire() {
    let relayed = Relayed::start("1s").await;
    let token = relayed.holder.token;
    // A partition: the connection stays open, nothing crosses it.
    relayed.relay.set(RelayMode::Stall);
    let stalled = Instant::now();
    until_answered(
        &relayed.gateway,
        "/inv/3",
        token,
        (503, "authority-unavailable"),
    )
    .await;
    let noticed = stalled.elapsed();
    relayed.relay.set(RelayMode::Pass);
    until_answered(&relayed.gateway, "/inv/3", token, (200, "")).await;
    eprintln!("a stalled connection was noticed after {noticed:?}");
    relayed.stop().await;
}

#[tokio::test]
async fn a_lock_path_zookeeper_refuses_has_no_holder_and_fails_no_other_write() {
    // U+FFFD is a character ZooKeeper's client refuses in a path: no node can have it.
    let root = unique_root();
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gateway = TestGateway::start(&route(
        &upstream.url(),
        "doc",
        &zk_authority(&root, "require_live_lease = true\nstrict = true"),
    ))
    .await;
    let lock = format!("{root}/locks/1");
    lock_node(&lock).await;
    let holder = zk_contend(&lock, Naming::Plain, CONTENDER_SESSION).await;
    until_answered(&gateway, "/doc/1", holder.token, (200, "")).await;
    assert_eq!(
        write(&gateway, "/doc/%EF%BF%BD", 7).await,
        (409, "lease-ended".to_owned()),
        "no one can hold a lock ZooKeeper cannot name"
    );
    // Confirmed in batches: the refused path and the holder's write, sent together, each get
    // their own answer.
    let (odd, held) = tokio::join!(
        write(&gateway, "/doc/%EF%BF%BD", 7),
        write(&gateway, "/doc/1", holder.token)
    );
    assert_eq!(odd, (409, "lease-ended".to_owned()));
    assert_eq!(held, (200, String::new()));
    holder.release().await;
    gateway.stop().await;
    zk_delete_tree(&zk_observer().await, &root).await;
}
