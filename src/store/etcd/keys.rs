//! Where fencegate's data lives in etcd, every key under the configured prefix: marks, the store
//! identity record, intents and their two indexes, key turns. Marks are 20 ASCII digits (every
//! u64 fits), so etcd's byte-wise value comparison orders them as numbers.

/// Digits of a stored mark or index time: `u64::MAX` has 20.
const WIDTH: usize = 20;

/// The key names under one prefix.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    pub(super) fn mark(&self, key: &str) -> String {
        format!("{}mark/{key}", self.prefix)
    }

    pub(super) fn store_id(&self) -> String {
        format!("{}store_id", self.prefix)
    }

    pub(super) fn intent(&self, key: &str) -> String {
        format!("{}intent/{key}", self.prefix)
    }

    pub(super) fn turn(&self, key: &str) -> String {
        format!("{}turn/{key}", self.prefix)
    }

    /// The index entry of a SUBMITTING intent, ordered by its last update.
    pub(super) fn submitting(&self, updated_ms: u64, key: &str) -> String {
        format!("{}{updated_ms:020}/{key}", self.submitting_prefix())
    }

    /// The index entry of an intent's end of retention.
    pub(super) fn expiry(&self, expires_ms: u64, key: &str) -> String {
        format!("{}{expires_ms:020}/{key}", self.expiry_prefix())
    }

    pub(super) fn submitting_prefix(&self) -> String {
        format!("{}intents/submitting/", self.prefix)
    }

    pub(super) fn expiry_prefix(&self) -> String {
        format!("{}intents/expiry/", self.prefix)
    }

    /// The first index key under `index_prefix` whose time is `ms` or later: the end of the
    /// range of entries before `ms`.
    pub(super) fn index_bound(index_prefix: &str, ms: u64) -> String {
        format!("{index_prefix}{ms:020}")
    }

    /// The time and intent key of an index entry under `index_prefix`.
    pub(super) fn parse_index(index_prefix: &str, entry: &str) -> Option<(u64, String)> {
        let rest = entry.strip_prefix(index_prefix)?;
        let (time, key) = rest.split_at_checked(WIDTH)?;
        let key = key.strip_prefix('/')?;
        Some((time.parse().ok()?, key.to_owned()))
    }
}

/// A mark as stored: 20 digits, zero-padded.
pub(super) fn encode_mark(mark: u64) -> String {
    format!("{mark:020}")
}

/// A stored mark; anything but 20 digits is an error, never a guess.
pub(super) fn decode_mark(stored: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(stored).unwrap_or_default();
    if text.len() != WIDTH || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "the stored mark {:?} is not {WIDTH} digits",
            String::from_utf8_lossy(stored)
        ));
    }
    text.parse()
        .map_err(|_| format!("the stored mark {text:?} is beyond u64"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_order_as_bytes_the_way_they_order_as_numbers() {
        let values = [0, 9, 10, 99, 100, (1 << 53) + 1, u64::MAX - 1, u64::MAX];
        for pair in values.windows(2) {
            assert!(encode_mark(pair[0]).as_bytes() < encode_mark(pair[1]).as_bytes());
        }
        for value in values {
            assert_eq!(decode_mark(encode_mark(value).as_bytes()), Ok(value));
        }
        assert!(decode_mark(b"5").is_err());
        assert!(decode_mark(b"99999999999999999999").is_err());
        assert!(decode_mark(b"0000000000000000000x").is_err());
    }

    #[test]
    fn index_entries_name_their_time_and_key() {
        let keys = Keys::new("fg/");
        let entry = keys.submitting(42, "payout:a/b");
        let prefix = keys.submitting_prefix();
        assert_eq!(
            Keys::parse_index(&prefix, &entry),
            Some((42, "payout:a/b".to_owned()))
        );
        assert!(entry < Keys::index_bound(&prefix, 43));
        assert!(entry >= Keys::index_bound(&prefix, 42));
    }
}
