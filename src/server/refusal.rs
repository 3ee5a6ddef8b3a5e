//! The answer to a connection over `server.max_connections`: one fixed HTTP/1.1 503 problem with
//! `Connection: close` and `Retry-After`, written without parsing the client's request.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Seconds a refused client should wait before connecting again.
const RETRY_AFTER_SECS: u32 = 1;
/// How long writing the refusal, and then draining what the client sent, may take: a client that
/// does not read cannot hold the socket longer.
const REFUSAL_IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Most request bytes read and discarded after the refusal, so that closing the socket does not
/// reset it (and lose the answer) while the client's request is still unread.
const DRAIN_LIMIT: usize = 64 * 1024;

const BODY: &str = concat!(
    r#"{"type":"https://fencegate.dev/problems/too-many-connections","#,
    r#""title":"Too many connections","status":503,"#,
    r#""detail":"the gateway is serving its maximum number of connections; retry shortly"}"#
);

/// The whole response, status line to body.
fn refusal_bytes() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: {RETRY_AFTER_SECS}\r\n\r\n{BODY}",
        BODY.len()
    )
}

/// Writes the refusal, half-closes, drains a little of the request, then drops the socket.
pub async fn refuse_connection(mut stream: TcpStream) {
    let answer = refusal_bytes();
    let written = tokio::time::timeout(REFUSAL_IO_TIMEOUT, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    let _ = tokio::time::timeout(REFUSAL_IO_TIMEOUT, async {
        let mut buffer = [0u8; 4096];
        let mut drained = 0;
        while drained < DRAIN_LIMIT {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::{refusal_bytes, BODY};

    #[test]
    fn refusal_is_a_complete_closing_problem_response() {
        let text = refusal_bytes();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("\r\nconnection: close\r\n"));
        assert!(text.contains("\r\nretry-after: 1\r\n"));
        let (_, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert_eq!(body, BODY);
        assert!(text.contains(&format!("content-length: {}\r\n", BODY.len())));
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(json["status"], 503);
    }
}
