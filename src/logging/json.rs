//! JSON log lines without the characters serde_json leaves raw: it escapes only `"`, `\` and
//! 0x00-0x1F, so DEL, C1 controls and bidi characters are rewritten here as `\uXXXX` escapes.
//!
//! Outside its strings a JSON line is ASCII, so any such character is inside a string and its
//! `\uXXXX` form is the same JSON value: log shippers read exactly what the request sent.

use std::io;

use tracing_subscriber::fmt::MakeWriter;

use super::escape::{classify, Unsafe};

/// Wraps a [`MakeWriter`] so that every writer it makes is a [`JsonEscaping`].
pub struct JsonSafe<M> {
    inner: M,
}

impl<M> JsonSafe<M> {
    pub fn new(inner: M) -> Self {
        JsonSafe { inner }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for JsonSafe<M> {
    type Writer = JsonEscaping<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        JsonEscaping {
            inner: self.inner.make_writer(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        JsonEscaping {
            inner: self.inner.make_writer_for(meta),
        }
    }
}

/// An `io::Write` for serde_json's output that escapes what [`classify`] flags and serde_json
/// does not (the C0 controls it has already escaped; a raw one left is the line's end).
pub struct JsonEscaping<W> {
    inner: W,
}

impl<W: io::Write> io::Write for JsonEscaping<W> {
    /// The formatter writes each line in one call. A line that is not UTF-8 (a character cut
    /// between two calls) cannot come from serde_json and is passed on as it is.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.iter().all(|&b| b < 0x7f) {
            return self.inner.write(buf);
        }
        let Ok(text) = std::str::from_utf8(buf) else {
            return self.inner.write(buf);
        };
        let mut clean_from = 0;
        for (at, c) in text.char_indices() {
            if let Some(Unsafe::Ascii(0x7f) | Unsafe::Unicode(_)) = classify(c) {
                self.inner.write_all(&buf[clean_from..at])?;
                write!(self.inner, "\\u{:04x}", u32::from(c))?;
                clean_from = at + c.len_utf8();
            }
        }
        self.inner.write_all(&buf[clean_from..])?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn rewritten(line: &str) -> String {
        let mut out = Vec::new();
        JsonEscaping { inner: &mut out }
            .write_all(line.as_bytes())
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_plain_line_is_passed_on_as_it_is() {
        let line = "{\"key\":\"docs:é\\n\\\\\"}\n";
        assert_eq!(rewritten(line), line);
    }

    #[test]
    fn del_c1_and_bidi_characters_become_json_escapes_of_the_same_value() {
        let line = "{\"key\":\"a\u{7f}b\u{9b}c\u{202e}d\"}\n";
        let out = rewritten(line);
        assert_eq!(out, "{\"key\":\"a\\u007fb\\u009bc\\u202ed\"}\n");
        let before: serde_json::Value = serde_json::from_str(line).unwrap();
        let after: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(before, after);
    }
}
