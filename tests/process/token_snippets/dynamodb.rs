//! The DynamoDB snippet (dynamodb_lock.py: a conditional counter) against moto's emulation of
//! DynamoDB, started here, with boto3 and moto.

use std::process::Command;

use super::{require_python_module, two_holders_then_a_zombie_with, PYTHON_INSTALL};

/// The DynamoDB snippet against moto's emulation of DynamoDB (`python3 -m moto.server`), the only
/// DynamoDB this project can run: it shows the snippet's conditional counter as moto implements
/// DynamoDB's update expressions, not DynamoDB itself.
#[tokio::test]
async fn dynamodb_lock_snippet_writes_with_its_items_fence_on_moto() {
    require_python_module("moto.server", PYTHON_INSTALL);
    require_python_module("boto3", PYTHON_INSTALL);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut moto = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 -m moto.server");
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "moto's server did not listen on {endpoint}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let env = [
        ("AWS_ACCESS_KEY_ID", "fencegate-test"),
        ("AWS_SECRET_ACCESS_KEY", "fencegate-test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ];
    let args = move |url: String| {
        vec![
            url,
            "--endpoint-url".to_owned(),
            endpoint.clone(),
            "--table".to_owned(),
            "locks".to_owned(),
        ]
    };
    let outcome = tokio::spawn({
        let env = env.map(|(k, v)| (k.to_owned(), v.to_owned()));
        async move {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            two_holders_then_a_zombie_with("dynamodb_lock.py", &env, args).await;
        }
    })
    .await;
    let _ = moto.kill();
    let _ = moto.wait();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
