//! `promtool check metrics`, Prometheus's own parser and linter, run on an exposition.

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Runs `promtool check metrics` on `text`; panics with its complaint.
pub fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; .ci/run installs it) must be installed");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("write the exposition to promtool");
    let output = child.wait_with_output().expect("promtool's answer");
    assert!(
        output.status.success(),
        "promtool rejected the exposition:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
