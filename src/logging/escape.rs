//! The escaping rule for log output, and a `fmt::Write` adapter that applies it as text goes by:
//! a string from a request can neither end a log line nor send a control sequence to a terminal.

use std::fmt;

/// A character that is not written as it is, and how it is written instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsafe {
    /// An ASCII control character (0x00-0x1F, 0x7F): `\xNN`, lower-case hex.
    Ascii(u8),
    /// The backslash, which starts every escape: `\\`, so an escape and the same text typed by a
    /// client read differently.
    Backslash,
    /// A C1 control or an invisible format, bidi or line-separator character: `\u{XXXX}`.
    Unicode(char),
}

/// How `c` must be written in a log line, or `None` when it is written as it is.
///
/// Besides the C0 and C1 controls, this catches the characters that change how a line reads
/// without showing: zero-width characters and marks (U+200B-U+200F), the Unicode line and
/// paragraph separators that some viewers break lines at (U+2028-U+2029), bidi embeddings and
/// overrides (U+202A-U+202E), invisible operators and bidi isolates (U+2060-U+2069), and the
/// zero-width no-break space (U+FEFF).
pub fn classify(c: char) -> Option<Unsafe> {
    match c {
        '\\' => Some(Unsafe::Backslash),
        '\0'..='\x1f' | '\x7f' => Some(Unsafe::Ascii(c as u8)),
        ' '..='~' => None,
        '\u{80}'..='\u{9f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2069}'
        | '\u{feff}' => Some(Unsafe::Unicode(c)),
        _ => None,
    }
}

/// Writes `escape` the way [`classify`] says it is written in text logs.
fn write_escape(out: &mut impl fmt::Write, escape: Unsafe) -> fmt::Result {
    match escape {
        Unsafe::Ascii(byte) => write!(out, "\\x{byte:02x}"),
        Unsafe::Backslash => out.write_str("\\\\"),
        Unsafe::Unicode(c) => write!(out, "\\u{{{:04x}}}", u32::from(c)),
    }
}

/// A `fmt::Write` that escapes what it is given and passes it to `inner`. Text with nothing to
/// escape goes through in one `write_str`, without allocating; otherwise the runs between
/// escapes do.
pub struct Escaping<W> {
    inner: W,
}

impl<W: fmt::Write> Escaping<W> {
    pub fn new(inner: W) -> Self {
        Escaping { inner }
    }
}

impl<W: fmt::Write> fmt::Write for Escaping<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if s.bytes().all(|b| matches!(b, b' '..=b'~') && b != b'\\') {
            return self.inner.write_str(s);
        }
        let mut clean_from = 0;
        for (at, c) in s.char_indices() {
            if let Some(escape) = classify(c) {
                self.inner.write_str(&s[clean_from..at])?;
                write_escape(&mut self.inner, escape)?;
                clean_from = at + c.len_utf8();
            }
        }
        self.inner.write_str(&s[clean_from..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    fn escaped(s: &str) -> String {
        let mut out = String::new();
        Escaping::new(&mut out).write_str(s).unwrap();
        out
    }

    #[test]
    fn printable_text_is_written_as_it_is() {
        for text in ["docs:42", "a b~!\"'{}[]", "docs:é/文/🙂", "\u{a0}nbsp", ""] {
            assert_eq!(escaped(text), text);
        }
    }

    #[test]
    fn ascii_controls_are_lower_case_hex_escapes() {
        assert_eq!(escaped("a\nERROR fake"), r"a\x0aERROR fake");
        assert_eq!(escaped("\r\t\0"), r"\x0d\x09\x00");
        assert_eq!(escaped("\x1b[31mred"), r"\x1b[31mred");
        assert_eq!(escaped("\x1f\x7f"), r"\x1f\x7f");
    }

    #[test]
    fn the_backslash_is_doubled_so_escapes_are_unambiguous() {
        assert_eq!(escaped(r"\x0a"), r"\\x0a");
        assert_ne!(escaped(r"\x0a"), escaped("\n"));
    }

    #[test]
    fn c1_controls_are_unicode_escapes() {
        assert_eq!(escaped("\u{80}"), r"\u{0080}");
        assert_eq!(escaped("a\u{9b}31m"), r"a\u{009b}31m");
        assert_eq!(escaped("\u{9f}\u{a0}"), "\\u{009f}\u{a0}");
    }

    #[test]
    fn invisible_format_and_bidi_characters_are_unicode_escapes() {
        for (c, text) in [
            ('\u{200b}', r"\u{200b}"),
            ('\u{200f}', r"\u{200f}"),
            ('\u{2028}', r"\u{2028}"),
            ('\u{202a}', r"\u{202a}"),
            ('\u{202e}', r"\u{202e}"),
            ('\u{2060}', r"\u{2060}"),
            ('\u{2069}', r"\u{2069}"),
            ('\u{feff}', r"\u{feff}"),
        ] {
            assert_eq!(escaped(&c.to_string()), text, "{c:?}");
        }
        for c in ['\u{200a}', '\u{2010}', '\u{2027}', '\u{202f}', '\u{206a}'] {
            assert_eq!(escaped(&c.to_string()), c.to_string(), "{c:?}");
        }
    }

    #[test]
    fn text_with_nothing_to_escape_is_one_write() {
        struct Count(usize);
        impl fmt::Write for Count {
            fn write_str(&mut self, _: &str) -> fmt::Result {
                self.0 += 1;
                Ok(())
            }
        }
        let mut count = Count(0);
        Escaping::new(&mut count)
            .write_str("docs:an-ordinary-key/é")
            .unwrap();
        assert_eq!(count.0, 1);
    }

    #[test]
    fn formatted_values_are_escaped_as_they_are_written() {
        let mut out = String::new();
        let key = String::from("k\n");
        write!(Escaping::new(&mut out), "{key}={:?}", '\x1b').unwrap();
        assert_eq!(out, r"k\x0a='\\u{1b}'");
    }
}
