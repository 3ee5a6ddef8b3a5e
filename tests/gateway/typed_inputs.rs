//! Typed key inputs (`{id:int}`, `{id:uuid}`, `{query:id:int}`, `{header:X-Name:uuid}`) over real
//! sockets: every spelling of one id is keyed and forwarded in one canonical form, a value not of
//! its type is refused before anything is forwarded, and an untyped input that frameworks would
//! read as a number or UUID spelled another way is refused on a fenced method.

use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

const UUID: &str = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";

fn routes(upstream: &str) -> String {
    format!(
        r#"
[[routes]]
name = "orders"
path = "/orders/{{id:int}}"
upstream = "{upstream}"
resource_key = "order:{{id}}"

[[routes]]
name = "tickets"
path = "/tickets/{{id:uuid}}"
upstream = "{upstream}"
resource_key = "ticket:{{id}}"

[[routes]]
name = "ledgers"
path = "/ledgers"
upstream = "{upstream}"
resource_key = "ledger:{{query:id:int}}:{{header:X-Crate:uuid}}"

[[routes]]
name = "parcels"
path = "/parcels/{{id}}"
upstream = "{upstream}"
resource_key = "parcel:{{id}}"

[[routes]]
name = "files"
path = "/files/{{name:str}}"
upstream = "{upstream}"
resource_key = "file:{{name}}"
"#
    )
}

#[tokio::test]
async fn typed_values_are_keyed_and_forwarded_in_one_canonical_form() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&routes(&upstream.url())).await;
    let put = |path: &str, fence: u64, headers: Vec<(&'static str, String)>| {
        let url = gw.url(path);
        async move {
            let mut all: Vec<(&str, String)> = vec![("x-fence", fence.to_string())];
            all.extend(headers);
            let borrowed: Vec<(&str, &str)> = all.iter().map(|(n, v)| (*n, v.as_str())).collect();
            send("PUT", &url, &borrowed, "x").await
        }
    };
    assert_eq!(put("/orders/0042/", 10, vec![]).await.status, 200);
    // Every other spelling of order 42 meets the same mark.
    let stale = put("/orders/42", 9, vec![]).await;
    assert_eq!(stale.status, 409, "{:?}", stale.body);
    assert_eq!(stale.json()["key"], "order:42");
    let braced = format!("/tickets/%7B{}%7D", UUID.to_uppercase());
    assert_eq!(put(&braced, 3, vec![]).await.status, 200);
    assert_eq!(
        put(&format!("/tickets/{UUID}"), 2, vec![]).await.status,
        409
    );
    let ledger = put(
        "/ledgers?v=007&id=007",
        5,
        vec![("x-crate", UUID.replace('-', "").to_uppercase())],
    )
    .await;
    assert_eq!(ledger.status, 200, "{:?}", ledger.body);
    let seen = upstream.seen();
    let targets: Vec<&str> = seen.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/orders/42/".to_owned(),
            format!("/tickets/{UUID}"),
            "/ledgers?v=007&id=7".to_owned()
        ]
    );
    assert_eq!(seen[2].header("x-crate"), Some(UUID));
    assert_eq!(
        gw.store()
            .current(&format!("ledger:7:{UUID}"))
            .await
            .expect("mark"),
        Some(5)
    );
}

#[tokio::test]
async fn values_not_of_their_type_and_untyped_look_alikes_are_refused_unforwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&routes(&upstream.url())).await;
    for (method, path, headers) in [
        ("PUT", "/orders/%2B42", vec![]),
        ("PUT", "/orders/4%202", vec![]),
        ("GET", "/orders/0x2A", vec![]),
        ("PUT", "/tickets/1-2-3-4-5", vec![]),
        ("PUT", "/ledgers?id=-7", vec![("x-crate", UUID)]),
        ("PUT", "/ledgers?id=7", vec![("x-crate", "not-a-uuid")]),
        ("PUT", "/parcels/042", vec![]),
        ("PUT", "/parcels/%2B42", vec![]),
        (
            "PUT",
            "/parcels/A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            vec![],
        ),
    ] {
        let mut all = vec![("x-fence", "5")];
        all.extend(headers);
        let reply = send(method, &gw.url(path), &all, "").await;
        assert_eq!(reply.status, 400, "{method} {path}: {:?}", reply.body);
        assert_eq!(
            reply.json()["type"],
            "https://fencegate.dev/problems/invalid-resource-key",
            "{method} {path}"
        );
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    // Reads are not guarded: an untyped segment is forwarded as sent. `:str` keys as sent.
    assert_eq!(
        send("GET", &gw.url("/parcels/042"), &[], "").await.status,
        200
    );
    let file = send("PUT", &gw.url("/files/042"), &[("x-fence", "5")], "").await;
    assert_eq!(file.status, 200);
    assert_eq!(gw.store().current("file:042").await.expect("mark"), Some(5));
    let targets: Vec<String> = upstream.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["/parcels/042", "/files/042"]);
}
