//! W3C trace context: the `traceparent` header (`00-<trace id>-<parent id>-<flags>`), read
//! strictly as the recommendation writes it; anything else is treated as absent.

use http::HeaderMap;

/// The `traceparent` request header.
pub const TRACEPARENT: &str = "traceparent";

/// A valid version-00 `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// The request's `traceparent`, when it carries exactly one valid value.
    pub fn from_headers(headers: &HeaderMap) -> Option<TraceParent> {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        TraceParent::parse(value.to_str().ok()?)
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (lowercase); an all-zero id is invalid. Later
    /// versions may append fields after the flags, which are ignored.
    pub fn parse(text: &str) -> Option<TraceParent> {
        let mut fields = text.trim().splitn(5, '-');
        let version = fields.next()?;
        let trace = fields.next()?;
        let parent = fields.next()?;
        let flags = fields.next()?;
        let rest = fields.next();
        if version.len() != 2 || version == "ff" || (version == "00" && rest.is_some()) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let parent_id: [u8; 8] = hex(parent)?;
        let [flags] = hex::<1>(flags)?;
        let _version: [u8; 1] = hex(version)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }
}

/// `N` bytes from exactly `2N` lowercase hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_valid_traceparents_only() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(valid).expect("valid");
        assert_eq!(parsed.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.flags, 1);
        for invalid in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(invalid), None, "{invalid:?}");
        }
        // A later version may carry more fields.
        assert!(TraceParent::parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"
        )
        .is_some());
    }
}
