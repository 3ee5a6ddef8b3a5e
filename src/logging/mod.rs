//! Logging: lines on stderr as text for people or JSON for log shippers, filtered by `RUST_LOG`,
//! with no raw control character from a request in any field of either ([`escape`] has the rule).

pub mod escape;
mod fields;
mod json;

use tracing::Dispatch;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::{SubscriberInitExt as _, TryInitError};
use tracing_subscriber::EnvFilter;

pub use fields::EscapedFields;
pub use json::JsonSafe;

/// The filter when `RUST_LOG` is unset or unreadable: refusals are logged at info.
const DEFAULT_FILTER: &str = "info";

/// The shape of the log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event, fields as `name=value`, values escaped; coloured on a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG`; fails if a subscriber is already set.
pub fn start(format: LogFormat) -> Result<(), TryInitError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    dispatch(format, filter, ansi, std::io::stderr).try_init()
}

/// Holds the writer thread of [`start_buffered`]; dropping it writes what is queued and flushes.
#[must_use = "dropping it ends buffered logging"]
pub struct LogWriter {
    _guard: tracing_appender::non_blocking::WorkerGuard,
}

/// [`start`] for a long-running server: lines are queued (never dropped; a serving thread waits
/// if 128k lines are queued) for a writer thread, which writes them in buffered runs and flushes
/// whenever the queue is empty. Keep the returned guard until the process ends.
pub fn start_buffered(format: LogFormat) -> Result<LogWriter, TryInitError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("fencegate-log")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    dispatch(format, filter, ansi, writer).try_init()?;
    Ok(LogWriter { _guard: guard })
}

/// The subscriber [`start`] installs, writing to `writer`; `ansi` colours the text format.
pub fn dispatch<W>(format: LogFormat, filter: EnvFilter, ansi: bool, writer: W) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => logs
            .with_ansi(ansi)
            .fmt_fields(EscapedFields)
            .with_writer(writer)
            .finish()
            .into(),
        // One flat object per line: the event's fields beside `timestamp`, `level` and
        // `target`, not nested under `fields`, as log pipelines index them.
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_ansi(false)
            .with_writer(JsonSafe::new(writer))
            .finish()
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What a request might put in a key: a forged line, a colour, a terminal title, C1, bidi.
    const HOSTILE: &str = "a\nERROR fake line\r\x1b[35m\x1b]0;pwned\x07\u{9b}\u{202e}\x7f\\";
    const HOSTILE_ESCAPED: &str =
        r"a\x0aERROR fake line\x0d\x1b[35m\x1b]0;pwned\x07\u{009b}\u{202e}\x7f\\";

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(format: LogFormat, ansi: bool, log: impl FnOnce()) -> String {
        let capture = Capture::default();
        let writer = capture.clone();
        let dispatch = dispatch(format, EnvFilter::new("info"), ansi, move || writer.clone());
        tracing::dispatcher::with_default(&dispatch, log);
        let bytes = capture.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn assert_contains(out: &str, expected: &str) {
        assert!(out.contains(expected), "{expected:?} not in {out:?}");
    }

    fn assert_one_clean_line(out: &str) {
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(out.ends_with('\n'), "{out:?}");
        for c in ['\r', '\x07', '\x7f', '\u{9b}', '\u{202e}'] {
            assert!(!out.contains(c), "raw {c:?} in {out:?}");
        }
    }

    #[test]
    fn text_escapes_display_values() {
        let out = logged(LogFormat::Text, false, || {
            tracing::info!(key = %HOSTILE, token = 3, "refused");
        });
        assert_one_clean_line(&out);
        assert!(!out.contains('\x1b'), "{out:?}");
        assert_contains(&out, &format!("refused key={HOSTILE_ESCAPED} token=3"));
    }

    #[test]
    fn text_escapes_string_debug_and_error_values_and_the_message() {
        let error = std::io::Error::other(format!("bad key {HOSTILE}"));
        let out = logged(LogFormat::Text, false, || {
            tracing::info!(
                key = HOSTILE,
                debug = ?HOSTILE,
                error = &error as &(dyn std::error::Error + 'static),
                "refused {HOSTILE}"
            );
        });
        assert_one_clean_line(&out);
        assert!(!out.contains('\x1b'), "{out:?}");
        assert_contains(&out, &format!("refused {HOSTILE_ESCAPED} "));
        assert_contains(&out, &format!("key=\"{HOSTILE_ESCAPED}\""));
        assert_contains(&out, &format!("error=bad key {HOSTILE_ESCAPED}"));
        assert_contains(&out, r#"debug="a\\nERROR fake line\\r\\u{1b}[35m"#);
    }

    #[test]
    fn text_escapes_span_fields() {
        let out = logged(LogFormat::Text, false, || {
            tracing::info_span!("request", key = %HOSTILE).in_scope(|| tracing::info!("refused"));
        });
        assert_one_clean_line(&out);
        assert_contains(&out, &format!("request{{key={HOSTILE_ESCAPED}}}"));
    }

    #[test]
    fn coloured_text_keeps_its_styles_and_escapes_only_field_content() {
        let out = logged(LogFormat::Text, true, || {
            tracing::info!(key = %HOSTILE, "refused");
        });
        assert_one_clean_line(&out);
        assert_contains(&out, "\x1b[32m INFO\x1b[0m");
        assert_contains(
            &out,
            &format!("\x1b[3mkey\x1b[0m\x1b[2m=\x1b[0m{HOSTILE_ESCAPED}"),
        );
        assert!(
            !out.contains("\x1b[35m") && !out.contains("\x1b]"),
            "{out:?}"
        );
    }

    #[test]
    fn json_keeps_values_exact_and_lines_free_of_raw_controls() {
        let out = logged(LogFormat::Json, false, || {
            tracing::info!(key = %HOSTILE, "refused {HOSTILE}");
        });
        assert_one_clean_line(&out);
        assert!(!out.contains('\x1b'), "{out:?}");
        let line: serde_json::Value = serde_json::from_str(&out).unwrap();
        // Flat: the event's fields beside the line's own members.
        assert_eq!(line["key"], HOSTILE);
        assert_eq!(line["message"], format!("refused {HOSTILE}"));
        assert_eq!(line["level"], "INFO");
        assert!(line.get("fields").is_none(), "{line}");
    }
}
