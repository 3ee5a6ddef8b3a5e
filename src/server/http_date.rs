//! The `date` field's value (RFC 9110 §6.6.1), formatted once a second by each serving thread's
//! HTTP/1 server instead of once a response, as hyper's server does with its own cache.

use std::time::{SystemTime, UNIX_EPOCH};

/// The value for the current second.
#[derive(Debug, Default)]
pub struct HttpDate {
    /// Seconds since the epoch the value is for (0: none yet).
    second: u64,
    value: String,
}

impl HttpDate {
    /// The value at `now`, formatted again only when its second has changed.
    pub fn at(&mut self, now: SystemTime) -> &[u8] {
        let second = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        if second != self.second || self.value.is_empty() {
            self.second = second;
            self.value = httpdate::fmt_http_date(now);
        }
        self.value.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_value_changes_with_the_second_only() {
        let mut date = HttpDate::default();
        let second = UNIX_EPOCH + Duration::from_secs(1_796_515_200);
        assert_eq!(date.at(second), b"Sun, 06 Dec 2026 00:00:00 GMT");
        let within = second + Duration::from_millis(999);
        assert_eq!(date.at(within), b"Sun, 06 Dec 2026 00:00:00 GMT");
        let next = second + Duration::from_secs(1);
        assert_eq!(date.at(next), b"Sun, 06 Dec 2026 00:00:01 GMT");
        let now = SystemTime::now();
        assert_eq!(date.at(now), httpdate::fmt_http_date(now).as_bytes());
    }
}
