//! Serde adapter for human-written durations such as `"30s"`, `"250ms"` or `"2m"`.

use std::time::Duration;

use serde::Deserializer;

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let parsed = zero_allowed::deserialize(deserializer)?;
    if parsed.is_zero() {
        return Err(serde::de::Error::custom(
            "a duration of zero is not allowed",
        ));
    }
    Ok(parsed)
}

/// The same, for a setting that may be left out (`#[serde(default, with = "duration::optional")]`).
pub mod optional {
    use std::time::Duration;

    use serde::Deserializer;

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::deserialize(deserializer).map(Some)
    }
}

/// The same, for the few settings where zero means "none" (`drain_delay = "0s"`: drain at once).
pub mod zero_allowed {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?}: {e} (write e.g. \"30s\" or \"250ms\")"
            ))
        })
    }
}
