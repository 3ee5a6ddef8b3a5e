//! The Redis snippet (redis_lock.py: `SET NX PX` and `INCR` in one script) against Redis at
//! 127.0.0.1:6379, with redis-py.

use super::{require_python_module, two_holders_then_a_zombie, PYTHON_INSTALL};

#[tokio::test]
async fn redis_lock_snippet_writes_with_its_counters_value() {
    require_python_module("redis", PYTHON_INSTALL);
    let lock = format!(
        "fencegate-test:{}:locks:invoice:42",
        uuid::Uuid::new_v4().simple()
    );
    let args = |url: String| {
        vec![
            url,
            "--redis".to_owned(),
            "redis://127.0.0.1:6379/0".to_owned(),
            "--lock".to_owned(),
            lock.clone(),
        ]
    };
    two_holders_then_a_zombie("redis_lock.py", args).await;
    // Both released: the lock is free, and its counter stays for the next grant.
    let client = redis::Client::open("redis://127.0.0.1:6379/0").expect("a Redis URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis at 127.0.0.1:6379 is required: {e}"));
    let held: Option<String> = redis::cmd("GET")
        .arg(&lock)
        .query_async(&mut connection)
        .await
        .expect("GET the lock");
    assert_eq!(held, None, "the second holder released the lock");
    let _: i64 = redis::cmd("DEL")
        .arg(&lock)
        .arg(format!("{lock}:fence"))
        .query_async(&mut connection)
        .await
        .expect("DEL the test's keys");
}
