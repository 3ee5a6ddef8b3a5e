//! The real binary's log lines carry no raw control character from a request: a resource key with
//! `%0a`, `%0d` or an escape sequence is written escaped in the text format and stays one JSON
//! string in the json format, so it can neither forge a line nor reach the terminal.

use crate::support::gateway::fenced_route;
use crate::support::process::stderr_path;
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream};

/// The forged line a `%0a` in a path tries to start.
const FORGED: &str = "ERROR fake line";

/// Path segments (still percent-encoded) and the key each decodes to under `docs:{id}`.
const HOSTILE: &[(&str, &str)] = &[
    ("a%0aERROR%20fake%20line", "docs:a\nERROR fake line"),
    ("b%1b%5b31mred", "docs:b\x1b[31mred"),
    ("c%0dover", "docs:c\rover"),
    ("d%c2%9b31m", "docs:d\u{9b}31m"),
    ("e%e2%80%aecba", "docs:e\u{202e}cba"),
];

/// Starts the binary at `RUST_LOG=info` with `extra_args`, gets a stale-token refusal (logged at
/// info with its key) for every hostile key, stops it and returns its stderr.
async fn log_of_stale_refusals(extra_args: &[&str]) -> String {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    // `{id:str}`: an untyped segment with a control character is refused before any key is
    // logged; a route that declares plain strings keys it as sent.
    let route = fenced_route("docs", &upstream.url(), "enforce", "monotonic")
        .replace("/docs/{id}", "/docs/{id:str}");
    let process = GatewayProcess::start_logging(dir.path(), &route, extra_args, "info");
    for (segment, _) in HOSTILE {
        let url = process.url(&format!("/docs/{segment}"));
        let accepted = send("PUT", &url, &[("x-fence", "5")], "x").await;
        assert_eq!(accepted.status, 200, "{segment}: {accepted:?}");
        let stale = send("PUT", &url, &[("x-fence", "3")], "x").await;
        assert_eq!(stale.status, 409, "{segment}: {stale:?}");
    }
    let status = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .expect("terminate task");
    assert_eq!(status.code(), Some(0), "{status}");
    std::fs::read_to_string(stderr_path(dir.path())).expect("read stderr")
}

/// What holds in either format: no raw ESC, CR or C1 control, and no line the request forged.
fn assert_no_raw_controls(text: &str) {
    for (i, c) in text.char_indices() {
        assert!(
            !matches!(c, '\x1b' | '\r' | '\u{80}'..='\u{9f}'),
            "raw {c:?} at byte {i} of the log:\n{text}"
        );
    }
    for line in text.lines() {
        assert!(
            !line.trim_start().starts_with(FORGED),
            "a request forged a log line: {line:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn text_log_escapes_control_characters_in_resource_keys() {
    let text = log_of_stale_refusals(&[]).await;
    assert_no_raw_controls(&text);
    for escaped in [
        r"key=docs:a\x0aERROR fake line",
        r"key=docs:b\x1b[31mred",
        r"key=docs:c\x0dover",
        r"key=docs:d\u{009b}31m",
        r"key=docs:e\u{202e}cba",
    ] {
        assert!(
            text.lines()
                .any(|line| line.contains("refused: stale fencing token") && line.contains(escaped)),
            "no stale refusal with {escaped} in the log:\n{text}"
        );
    }
    assert!(
        !text.contains('\u{202e}'),
        "a raw bidi override in the log:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn json_log_keeps_each_resource_key_one_json_string() {
    let text = log_of_stale_refusals(&["--log-format", "json"]).await;
    assert_no_raw_controls(&text);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        })
        .collect();
    for (_, key) in HOSTILE {
        assert!(
            lines.iter().any(|line| {
                line["message"] == "refused: stale fencing token" && line["key"] == *key
            }),
            "no stale refusal for {key:?} in the log:\n{text}"
        );
    }
}
