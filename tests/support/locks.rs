//! Lock clients as the lock services' own recipes take locks, for the authority tests: an etcd
//! lock (a key `<lock>/<lease hex>` under a lease; its create revision is the token) and the
//! PostgreSQL lease table of docs/getting-tokens.md (its `fence` is the token).

use std::time::Duration;

use base64::Engine as _;
use sqlx::Connection as _;

use super::etcd::call;
use super::postgres::connect;

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

/// A contender's key in an etcd lock, under its own lease.
#[derive(Debug, Clone)]
pub struct EtcdContender {
    pub lease: i64,
    pub key: String,
    /// The key's create revision: the token once the contender holds the lock.
    pub token: u64,
}

/// Puts a contender for `lock` under a new lease of `ttl` seconds (it holds the lock when no
/// older contender is left).
pub async fn etcd_contend(lock: &str, ttl: u64) -> EtcdContender {
    let granted = call(
        "/v3/lease/grant",
        serde_json::json!({"TTL": ttl.to_string()}),
    )
    .await;
    let lease: i64 = granted["ID"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("a lease id");
    let key = format!("{lock}/{lease:x}");
    let answer = call(
        "/v3/kv/txn",
        serde_json::json!({
            "compare": [{"key": b64(&key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(&key), "value": b64("holder"), "lease": lease.to_string()}}],
        }),
    )
    .await;
    assert_eq!(answer["succeeded"], true, "a fresh contender key: {answer}");
    let token = answer["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("the put's revision");
    EtcdContender { lease, key, token }
}

/// Ends a lease at once (its keys are deleted), as an unlock or an expiry would: the revision
/// of the deletes, when etcd reports one.
pub async fn etcd_revoke(lease: i64) -> Option<i64> {
    let answer = call(
        "/v3/lease/revoke",
        serde_json::json!({"ID": lease.to_string()}),
    )
    .await;
    answer["header"]["revision"].as_str()?.parse().ok()
}

/// The lowest create revision under `<lock>/`: the holder's token, if anyone contends.
pub async fn etcd_holder(lock: &str) -> Option<u64> {
    let start = format!("{lock}/");
    let end = format!("{lock}0");
    let answer = call(
        "/v3/kv/range",
        serde_json::json!({"key": b64(&start), "range_end": b64(&end), "keys_only": true}),
    )
    .await;
    answer["kvs"]
        .as_array()?
        .iter()
        .filter_map(|kv| kv["create_revision"].as_str()?.parse().ok())
        .min()
}

/// Renews a lease once.
pub async fn etcd_keep_alive(lease: i64) {
    call(
        "/v3/lease/keepalive",
        serde_json::json!({"ID": lease.to_string()}),
    )
    .await;
}

/// A PostgreSQL lease table in a schema of its own; dropped by `drop`.
pub struct LeaseTable {
    pub schema: String,
    pub table: String,
}

impl LeaseTable {
    pub async fn create() -> LeaseTable {
        let schema = super::postgres::unique_schema();
        let table = format!("{schema}.lock_leases");
        let mut connection = connect().await;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut connection)
            .await
            .expect("create schema");
        sqlx::query(&format!(
            "CREATE TABLE {table} (lock_key text PRIMARY KEY, owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL)"
        ))
        .execute(&mut connection)
        .await
        .expect("create the lease table");
        LeaseTable { schema, table }
    }

    /// Takes `lock` for `ttl` if it is free or expired: the new fence, else `None`.
    pub async fn acquire(&self, lock: &str, owner: &str, ttl: Duration) -> Option<u64> {
        let mut connection = connect().await;
        let fence: Option<i64> = sqlx::query_scalar(&format!(
            "INSERT INTO {t} (lock_key, owner, fence, expires_at) VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond') \
             ON CONFLICT (lock_key) DO UPDATE SET owner = EXCLUDED.owner, fence = {t}.fence + 1, expires_at = EXCLUDED.expires_at \
             WHERE {t}.expires_at <= now() RETURNING fence",
            t = self.table
        ))
        .bind(lock)
        .bind(owner)
        .bind(i64::try_from(ttl.as_millis()).expect("a short ttl"))
        .fetch_optional(&mut connection)
        .await
        .expect("acquire");
        fence.map(|f| u64::try_from(f).expect("a positive fence"))
    }

    /// Ends the lease now, keeping the row (so the fence never restarts).
    pub async fn release(&self, lock: &str, fence: u64) {
        let mut connection = connect().await;
        sqlx::query(&format!(
            "UPDATE {} SET expires_at = now() WHERE lock_key = $1 AND fence = $2",
            self.table
        ))
        .bind(lock)
        .bind(i64::try_from(fence).expect("fence"))
        .execute(&mut connection)
        .await
        .expect("release");
    }

    pub async fn drop(self) {
        super::postgres::drop_schema(&self.schema).await;
    }
}

/// A watch of every key under a prefix, from the test's side: when each key was deleted, by
/// revision and by the test's clock.
pub struct EtcdObserver {
    deletes: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EtcdObserver {
    pub async fn start(prefix: &str) -> EtcdObserver {
        use http_body_util::BodyExt as _;
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body = serde_json::json!({"create_request": {
            "key": b64(prefix),
            "range_end": base64::engine::general_purpose::STANDARD.encode(&end),
        }});
        let client = pooled_client();
        let request = http::Request::post(format!("{}/v3/watch", super::etcd::etcd_url()))
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .expect("a watch request");
        let response = client
            .request(request)
            .await
            .unwrap_or_else(|e| panic!("etcd's watch is required: {e}"));
        assert!(response.status().is_success(), "the watch started");
        let deletes = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let recorded = std::sync::Arc::clone(&deletes);
        let task = tokio::spawn(async move {
            let mut body = response.into_body();
            let mut buffer: Vec<u8> = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buffer.extend_from_slice(&data);
                while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(&line) else {
                        continue;
                    };
                    let events = answer["result"]["events"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    for event in events {
                        if event["type"] != "DELETE" {
                            continue;
                        }
                        let key = base64::engine::general_purpose::STANDARD
                            .decode(event["kv"]["key"].as_str().unwrap_or_default())
                            .ok()
                            .and_then(|k| String::from_utf8(k).ok())
                            .unwrap_or_default();
                        let revision = event["kv"]["mod_revision"]
                            .as_str()
                            .and_then(|r| r.parse().ok())
                            .unwrap_or_default();
                        recorded.lock().expect("deletes").insert(key, revision);
                    }
                }
            }
        });
        EtcdObserver { deletes, task }
    }

    /// Waits for `key`'s delete (its lease ended): the delete's revision.
    pub async fn deleted(&self, key: &str, within: Duration) -> i64 {
        let started = std::time::Instant::now();
        loop {
            if let Some(revision) = self.deletes.lock().expect("deletes").get(key) {
                return *revision;
            }
            assert!(started.elapsed() < within, "{key} was never deleted");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for EtcdObserver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type PooledClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

/// A keep-alive client, for callers that ask many times a second (no connection per request).
pub fn pooled_client() -> PooledClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// The revision a gateway's first lock authority reached, from `/admin/authorities`.
pub async fn authority_revision(client: &PooledClient, admin_url: &str, token: &str) -> i64 {
    use http_body_util::BodyExt as _;
    let request = http::Request::get(admin_url)
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("a request");
    let response = client.request(request).await.expect("the admin answers");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the admin's body")
        .to_bytes();
    let listed: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    listed["authorities"][0]["revision"].as_i64().unwrap_or(0)
}
