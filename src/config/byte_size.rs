//! Serde adapter for sizes such as `"64KiB"`, `"1MiB"`, `"512"` (bytes) or `"10kB"`.

use serde::{Deserialize, Deserializer};

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "invalid size {text:?} (write e.g. \"64KiB\", \"1MiB\" or \"512\")"
        ))
    })
}

/// Parses a number with an optional unit: B, kB, KiB, MB, MiB, GB, GiB.
pub fn parse(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number.parse().ok()?;
    let factor: usize = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn sizes() {
        assert_eq!(parse("512"), Some(512));
        assert_eq!(parse("64KiB"), Some(65_536));
        assert_eq!(parse("1 MiB"), Some(1 << 20));
        assert_eq!(parse("10kB"), Some(10_000));
        assert_eq!(parse("ten"), None);
        assert_eq!(parse("5 parsecs"), None);
    }
}
