//! JSON integers as JSON Schema reads them: `293` and `293.0` are the same integer, so the admin
//! API takes a whole number written with a fractional part of zero (serde alone refuses `293.0`
//! for an integer field). Fractions, negatives and out-of-range values are still refused.

use serde::{Deserialize, Deserializer};

/// 2^53: below it every whole number has an exact float.
const EXACT_FLOAT_LIMIT: f64 = 9_007_199_254_740_992.0;

/// A whole number that fits `T`, written as an integer or as a float without a fraction.
fn whole<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let number = serde_json::Number::deserialize(deserializer)?;
    let whole = number.as_u64().or_else(|| {
        number
            .as_f64()
            // Below 2^53 a float holds every whole number exactly (and serde_json's
            // float_roundtrip parses to it); from 2^53 on, `9007199254740993.0` is already
            // another number once parsed, so such floats are refused.
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < EXACT_FLOAT_LIMIT)
            // In range and whole by the filter.
            .map(|f| f as u64)
    });
    whole
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| serde::de::Error::custom(format!("{number} is not a whole number in range")))
}

pub(super) fn u64_field<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    whole(deserializer)
}

pub(super) fn optional_u16_field<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u16>, D::Error> {
    Option::<serde_json::Value>::deserialize(deserializer)?
        .map(|value| whole(value).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Body {
        #[serde(deserialize_with = "super::u64_field")]
        fence: u64,
        #[serde(default, deserialize_with = "super::optional_u16_field")]
        status: Option<u16>,
    }

    #[test]
    fn whole_numbers_in_either_spelling() {
        let body: Body = serde_json::from_str(r#"{"fence": 7.0, "status": 293.0}"#).unwrap();
        assert_eq!((body.fence, body.status), (7, Some(293)));
        let body: Body = serde_json::from_str(r#"{"fence": 2000000000000001.0}"#).unwrap();
        assert_eq!(body.fence, 2_000_000_000_000_001);
        let body: Body = serde_json::from_str(r#"{"fence": 8631412984417196.0}"#).unwrap();
        assert_eq!(body.fence, 8_631_412_984_417_196);
        let body: Body = serde_json::from_str(r#"{"fence": 7}"#).unwrap();
        assert_eq!((body.fence, body.status), (7, None));
        for refused in [
            r#"{"fence": 7.5}"#,
            r#"{"fence": -1}"#,
            r#"{"fence": 1, "status": 70000}"#,
            r#"{"fence": "7"}"#,
            r#"{"fence": 1e300}"#,
            r#"{"fence": 18446744073709551616}"#,
            r#"{"fence": 18446744073709551616.0}"#,
            r#"{"fence": 9007199254740993.0}"#,
            r#"{"fence": 9007199254740992.0}"#,
        ] {
            assert!(serde_json::from_str::<Body>(refused).is_err(), "{refused}");
        }
    }
}
