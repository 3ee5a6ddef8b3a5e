//! etcd helpers for tests: the machine's test servers (started by scripts/etcd-setup.sh), a
//! unique key prefix per test, raw reads and writes through etcd's JSON gateway, and cleanup.

use std::future::Future;

use base64::Engine as _;

use super::client::try_send;

/// The plain etcd every store test talks to.
pub const ETCD_ADDR: &str = "127.0.0.1:2379";

pub fn etcd_url() -> String {
    format!("http://{ETCD_ADDR}")
}

/// A key prefix no other test uses (under `fencegate-test/`, where the auth server's test user
/// may write).
pub fn unique_prefix() -> String {
    format!("fencegate-test/{}/", uuid::Uuid::new_v4())
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The end of the range of every key under `prefix` (its last byte incremented).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// Posts `body` to the API `path` of the plain test server; the answer's JSON. Fails (never
/// skips) when the server cannot be reached.
pub async fn call(path: &str, body: serde_json::Value) -> serde_json::Value {
    let url = format!("{}{path}", etcd_url());
    match try_send("POST", &url, &[], &body.to_string()).await {
        Ok(reply) if reply.status.is_success() => reply.json(),
        Ok(reply) => panic!("etcd {path} answered {}: {:?}", reply.status, reply.body),
        Err(e) => panic!(
            "these tests need etcd at {ETCD_ADDR} (scripts/ensure-services.sh starts one): {e}"
        ),
    }
}

/// Writes `value` under `key`, as another client of the cluster would.
pub async fn put(key: &str, value: &str) {
    call(
        "/v3/kv/put",
        serde_json::json!({"key": b64(key.as_bytes()), "value": b64(value.as_bytes())}),
    )
    .await;
}

/// The value under `key`, if any.
pub async fn get(key: &str) -> Option<String> {
    let answer = call(
        "/v3/kv/range",
        serde_json::json!({"key": b64(key.as_bytes())}),
    )
    .await;
    let value = answer["kvs"]
        .get(0)?
        .get("value")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value)
        .expect("base64 value");
    Some(String::from_utf8(bytes).expect("utf-8 value"))
}

/// The revision `key` was last written at, if it is there.
pub async fn mod_revision(key: &str) -> Option<i64> {
    let answer = call(
        "/v3/kv/range",
        serde_json::json!({"key": b64(key.as_bytes())}),
    )
    .await;
    let revision = answer["kvs"].get(0)?.get("mod_revision")?;
    // The JSON gateway writes 64-bit integers as strings.
    revision
        .as_str()
        .and_then(|text| text.parse().ok())
        .or_else(|| revision.as_i64())
}

/// Every key under `prefix`.
pub async fn keys_under(prefix: &str) -> Vec<String> {
    let answer = call(
        "/v3/kv/range",
        serde_json::json!({"key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix)), "keys_only": true}),
    )
    .await;
    let kvs = answer["kvs"].as_array().cloned().unwrap_or_default();
    kvs.iter()
        .map(|kv| {
            let key = base64::engine::general_purpose::STANDARD
                .decode(kv["key"].as_str().expect("key"))
                .expect("base64 key");
            String::from_utf8(key).expect("utf-8 key")
        })
        .collect()
}

/// Deletes every key under `prefix`.
pub async fn delete_keys(prefix: &str) {
    call(
        "/v3/kv/deleterange",
        serde_json::json!({"key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix))}),
    )
    .await;
}

/// Runs `test` with a fresh key prefix, then deletes every key under it, even when `test` fails.
pub async fn with_prefix<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let prefix = unique_prefix();
    // Fails here, naming the server, when there is none.
    call("/v3/kv/range", serde_json::json!({"key": b64(b"probe")})).await;
    let outcome = tokio::spawn(test(prefix.clone())).await;
    delete_keys(&prefix).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
