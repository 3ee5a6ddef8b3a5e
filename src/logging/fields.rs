//! The text format's fields: tracing-subscriber's `name=value` layout, with the message and every
//! value, events' and spans' alike, written through the [`Escaping`] adapter.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

use super::escape::Escaping;

/// How tracing-subscriber styles a field name and its `=` when colouring is on (italic, dimmed).
const ITALIC: &str = "\x1b[3m";
const DIMMED: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// The text format's [`FormatFields`](tracing_subscriber::fmt::FormatFields): like
/// tracing-subscriber's `DefaultFields`, but no value reaches the line unescaped.
#[derive(Clone, Copy, Debug, Default)]
pub struct EscapedFields;

impl<'a> MakeVisitor<Writer<'a>> for EscapedFields {
    type Visitor = EscapedVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        EscapedVisitor {
            writer: target,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// Writes one event's or span's fields, separated by spaces.
pub struct EscapedVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

/// A string field's value in quotes, as `DefaultFields` shows it (the escaping is done around it).
struct Quoted<'a>(&'a str);

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

impl EscapedVisitor<'_> {
    fn write_field(&mut self, name: &str, value: &dyn fmt::Debug) -> fmt::Result {
        if !self.is_empty {
            self.writer.write_char(' ')?;
        }
        self.is_empty = false;
        if name != "message" {
            let name = name.strip_prefix("r#").unwrap_or(name);
            if self.writer.has_ansi_escapes() {
                write!(self.writer, "{ITALIC}{name}{RESET}{DIMMED}={RESET}")?;
            } else {
                write!(self.writer, "{name}=")?;
            }
        }
        write!(Escaping::new(&mut self.writer), "{value:?}")
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &Quoted(value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `log.target` and the like: a bridged `log` record's metadata, which the event formatter
        // already shows in its place.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        self.result = self.write_field(field.name(), value);
    }
}

impl VisitOutput<fmt::Result> for EscapedVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for EscapedVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}
