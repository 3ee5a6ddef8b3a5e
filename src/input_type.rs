//! Typed key inputs: `{id:int}`, `{id:uuid}`, `{id:str}`, and the rule for untyped ones. A typed
//! value is put in one canonical form before it is keyed or forwarded (`042` → `42`); an untyped
//! value that common frameworks would read as the same number or UUID as another spelling is
//! refused, so that one resource never has two keys.

use std::borrow::Cow;
use std::fmt;

/// What a placeholder says its value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputType {
    /// No type given: kept as sent, but refused when frameworks would read it as a number or
    /// UUID spelled another way (see [`InputType::read`]).
    #[default]
    Untyped,
    /// `:str`: a plain string, kept as sent, whatever it looks like.
    Str,
    /// `:int`: an unsigned decimal integer of at most 64 bits, keyed without leading zeros.
    Int,
    /// `:uuid`: a UUID, keyed in lower-case hyphenated form.
    Uuid,
}

/// Why a value cannot be keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValueRefusal {
    #[error(
        "is not an unsigned decimal integer (ASCII digits only, at most 18446744073709551615)"
    )]
    NotInt,
    #[error("is not a UUID (32 hex digits, hyphenated 8-4-4-4-12 or not, optionally in braces or after `urn:uuid:`)")]
    NotUuid,
    #[error("has surrounding white space or a control character, which frameworks that parse numbers or UUIDs drop; type the placeholder (`:int`, `:uuid`) or declare it a plain string (`:str`)")]
    Spacing,
    #[error("is read by common frameworks (Python's int(), Rails, JavaScript's Number()/parseInt, Java, Go) as a number that another spelling also names (leading zeros, a sign, non-ASCII digits, a numeric prefix, also a UUID's leading digits); type the placeholder (`:int`, or `:uuid` for UUIDs) or declare it a plain string (`:str`)")]
    NumberSpelling,
    #[error("is above 9007199254740991, where JavaScript's Number() and parseInt read two ids as one; type the placeholder (`:int`) when the upstream reads ids exactly, or declare it a plain string (`:str`)")]
    BeyondJavaScript,
    #[error("is read by common UUID parsers as a UUID that another spelling also names (upper case, braces, missing or moved hyphens, `urn:uuid:`, Java's short form); type the placeholder (`:uuid`) or declare it a plain string (`:str`)")]
    UuidSpelling,
}

impl InputType {
    /// The type a placeholder's suffix names (`int`, `uuid`, `str`).
    pub fn from_suffix(suffix: &str) -> Option<InputType> {
        match suffix {
            "int" => Some(InputType::Int),
            "uuid" => Some(InputType::Uuid),
            "str" => Some(InputType::Str),
            _ => None,
        }
    }

    /// Whether values of this type are rewritten to a canonical form (`:int`, `:uuid`).
    pub fn has_canonical_form(self) -> bool {
        matches!(self, InputType::Int | InputType::Uuid)
    }

    /// Splits `name:type` into the name and its type, when the text after the last `:` names
    /// one; else the whole text is the name, untyped.
    pub fn split_suffix(text: &str) -> (&str, InputType) {
        match text.rsplit_once(':') {
            Some((name, suffix)) => match InputType::from_suffix(suffix) {
                Some(kind) => (name, kind),
                None => (text, InputType::Untyped),
            },
            None => (text, InputType::Untyped),
        }
    }

    /// The value as it is keyed and forwarded: typed values in their canonical form, untyped
    /// ones as sent once they are known not to be a number or UUID in another spelling.
    pub fn read(self, value: &str) -> Result<Cow<'_, str>, ValueRefusal> {
        match self {
            InputType::Str => Ok(Cow::Borrowed(value)),
            InputType::Int => canonical_int(value),
            InputType::Uuid => canonical_uuid(value),
            InputType::Untyped => check_untyped(value).map(|()| Cow::Borrowed(value)),
        }
    }
}

/// The suffix as a placeholder spells it (`:int`), empty for an untyped one.
impl fmt::Display for InputType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InputType::Untyped => "",
            InputType::Str => ":str",
            InputType::Int => ":int",
            InputType::Uuid => ":uuid",
        })
    }
}

fn canonical_int(value: &str) -> Result<Cow<'_, str>, ValueRefusal> {
    // `u64::from_str` takes a leading `+`: the digits are checked first.
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueRefusal::NotInt);
    }
    let number: u64 = value.parse().map_err(|_| ValueRefusal::NotInt)?;
    if is_canonical_decimal(value) {
        Ok(Cow::Borrowed(value))
    } else {
        Ok(Cow::Owned(number.to_string()))
    }
}

/// `0`, or ASCII digits without a leading zero.
fn is_canonical_decimal(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes[0] != b'0' || bytes.len() == 1)
}

/// Where a hyphenated UUID has its hyphens.
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

fn canonical_uuid(value: &str) -> Result<Cow<'_, str>, ValueRefusal> {
    if is_canonical_uuid(value) {
        return Ok(Cow::Borrowed(value));
    }
    let mut text = value;
    if text.len() >= 9 && text.is_char_boundary(9) && text[..9].eq_ignore_ascii_case("urn:uuid:") {
        text = &text[9..];
    }
    if let Some(inner) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        text = inner;
    }
    let bytes = text.as_bytes();
    let digits: Vec<u8> = match bytes.len() {
        36 if HYPHENS.iter().all(|&i| bytes[i] == b'-') => bytes
            .iter()
            .enumerate()
            .filter(|(i, _)| !HYPHENS.contains(i))
            .map(|(_, b)| *b)
            .collect(),
        32 => bytes.to_vec(),
        _ => return Err(ValueRefusal::NotUuid),
    };
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(ValueRefusal::NotUuid);
    }
    let mut canonical = String::with_capacity(36);
    for (i, digit) in digits.iter().enumerate() {
        if [8, 12, 16, 20].contains(&i) {
            canonical.push('-');
        }
        canonical.push(char::from(digit.to_ascii_lowercase()));
    }
    Ok(Cow::Owned(canonical))
}

/// Hex digits of either case, hyphenated 8-4-4-4-12.
fn is_hyphenated_uuid(bytes: &[u8]) -> bool {
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| {
            if HYPHENS.contains(&i) {
                *b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        })
}

/// Lower-case hex digits, hyphenated 8-4-4-4-12.
fn is_canonical_uuid(value: &str) -> bool {
    let bytes = value.as_bytes();
    is_hyphenated_uuid(bytes) && !bytes.iter().any(u8::is_ascii_uppercase)
}

/// The largest integer JavaScript's `Number()` and `parseInt` read exactly (2^53 − 1).
const MAX_EXACT_IN_JAVASCRIPT: u64 = 9_007_199_254_740_991;

/// An untyped value passes when it is a canonical decimal JavaScript reads exactly, or when no
/// common framework reads it as a number, and it is not a UUID in another spelling than the
/// canonical one.
fn check_untyped(value: &str) -> Result<(), ValueRefusal> {
    let mut chars = value.chars();
    let ends_blank = chars.next().is_some_and(is_blank) || chars.next_back().is_some_and(is_blank);
    if ends_blank || value.chars().any(char::is_control) {
        return Err(ValueRefusal::Spacing);
    }
    if is_canonical_decimal(value) {
        return match value.parse::<u64>() {
            Ok(number) if number <= MAX_EXACT_IN_JAVASCRIPT => Ok(()),
            _ => Err(ValueRefusal::BeyondJavaScript),
        };
    }
    if reads_as_number(value) {
        return Err(ValueRefusal::NumberSpelling);
    }
    if !is_canonical_uuid(value) && reads_as_uuid(value) {
        return Err(ValueRefusal::UuidSpelling);
    }
    Ok(())
}

/// What some parser drops around (or, in Spring's number conversion, inside) a value: Unicode
/// white space, Java's `Character.isWhitespace` and `String.trim` (control characters), and the
/// byte order mark JavaScript's `Number()` trims.
fn is_blank(c: char) -> bool {
    c.is_whitespace() || c.is_control() || c == '\u{feff}'
}

/// Whether some common parser reads a number from `value`: once every blank is removed (Spring's
/// number conversion removes them anywhere) and an optional sign, a digit of any script
/// (Python's `int()`, Java's `Long.parseLong`, Werkzeug's `\d`), which also covers `0x2A`, `0b1`,
/// `4_2`, `42abc`, `4.2e1` (JavaScript's `Number()` and `parseInt`, Ruby's `to_i` under Rails' id
/// casts) and a UUID that starts with a digit; a `.` and a digit (`Number(".42e2")`); or `#` and
/// a hex digit (Java's `Long.decode`, used by Spring).
fn reads_as_number(value: &str) -> bool {
    let mut chars = value.chars().filter(|&c| !is_blank(c)).peekable();
    if matches!(chars.peek(), Some('+' | '-')) {
        chars.next();
    }
    match chars.next() {
        Some(c) if c.is_numeric() => true,
        Some('.') => chars.next().is_some_and(char::is_numeric),
        Some('#') => chars.next().is_some_and(|c| c.is_ascii_hexdigit()),
        _ => false,
    }
}

/// Whether some common UUID parser reads `value` as a UUID: 32 hex digits once `urn:` and
/// `uuid:`, surrounding braces and every hyphen are removed (Python's `uuid.UUID`, PostgreSQL's
/// `uuid` input, Go's `uuid.Parse`); a hyphenated UUID between any two other bytes (Go's
/// `uuid.Parse` checks neither of them); or five hyphen-separated hex fields of any width
/// (Java's `UUID.fromString`, used by Spring).
fn reads_as_uuid(value: &str) -> bool {
    let bytes = value.as_bytes();
    // The shortest reading is Java's five one-digit fields, `a-b-c-d-e`.
    if bytes.len() < 9 {
        return false;
    }
    if bytes.len() == 38 && is_hyphenated_uuid(&bytes[1..37]) {
        return true;
    }
    let lower = value.to_ascii_lowercase();
    let stripped = lower.replace("urn:", "").replace("uuid:", "");
    let inner = stripped.trim_matches(['{', '}']);
    // Python's `uuid.UUID` takes any 32 characters `int(hex, 16)` reads: digits of any script,
    // `_`, a sign, `0x`, white space.
    let python = inner.chars().filter(|&c| c != '-');
    if python.clone().count() == 32
        && python.clone().all(|c| {
            c.is_ascii_hexdigit() || c.is_numeric() || c.is_whitespace() || "_+x".contains(c)
        })
    {
        return true;
    }
    // Java 8's `split("-")` drops trailing empty fields.
    let fields: Vec<&str> = inner.trim_end_matches('-').split('-').collect();
    fields.len() == 5
        && fields.iter().all(|field| {
            let digits = field.strip_prefix('+').unwrap_or(field);
            !digits.is_empty() && digits.chars().count() <= 16 && digits.chars().all(is_java_hex)
        })
}

/// A hex digit as Java's `Character.digit(c, 16)` reads one: ASCII, a decimal digit of any
/// script, or a full-width `A`-`F`.
fn is_java_hex(c: char) -> bool {
    c.is_ascii_hexdigit()
        || c.is_numeric()
        || ('\u{ff21}'..='\u{ff26}').contains(&c)
        || ('\u{ff41}'..='\u{ff46}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";

    #[test]
    fn ints_are_keyed_without_leading_zeros() {
        let read = |v: &str| InputType::Int.read(v).map(Cow::into_owned);
        for (sent, keyed) in [
            ("42", "42"),
            ("042", "42"),
            ("0000", "0"),
            ("0", "0"),
            ("18446744073709551615", "18446744073709551615"),
        ] {
            assert_eq!(read(sent).as_deref(), Ok(keyed), "{sent}");
        }
        for bad in [
            "",
            "+42",
            "-42",
            " 42",
            "42 ",
            "4_2",
            "0x2A",
            "42abc",
            "4.2e1",
            "\u{ff14}\u{ff12}",
            "18446744073709551616",
            "#2A",
        ] {
            assert_eq!(read(bad), Err(ValueRefusal::NotInt), "{bad:?}");
        }
    }

    #[test]
    fn uuids_are_keyed_lower_case_hyphenated() {
        let read = |v: &str| InputType::Uuid.read(v).map(Cow::into_owned);
        for sent in [
            UUID,
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "{A0EEBC999C0B4EF8BB6D6BB9BD380A11}",
            "urn:uuid:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "URN:UUID:A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
        ] {
            assert_eq!(read(sent).as_deref(), Ok(UUID), "{sent}");
        }
        for bad in [
            "",
            "1-2-3-4-5",
            "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
            "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            " a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc99+9c0b-4ef8-bb6d-6bb9bd380a11",
        ] {
            assert_eq!(read(bad), Err(ValueRefusal::NotUuid), "{bad:?}");
        }
    }

    #[test]
    fn strings_are_kept_as_sent() {
        for sent in ["042", " 42", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "x"] {
            assert_eq!(InputType::Str.read(sent).as_deref(), Ok(sent));
        }
    }

    #[test]
    fn untyped_values_pass_when_no_framework_reads_another_spelling_into_them() {
        for fine in [
            "42",
            "0",
            "acct1",
            "acme",
            "a b",
            "Invoice-7",
            UUID,
            "deadbeef",
            "x-1-2-3-4",
            "Infinity",
            "\u{e9}t\u{e9}",
        ] {
            assert_eq!(
                InputType::Untyped.read(fine).as_deref(),
                Ok(fine),
                "{fine:?}"
            );
        }
    }

    #[test]
    fn untyped_values_another_spelling_reads_as_are_refused() {
        let read = |v: &str| InputType::Untyped.read(v).map(Cow::into_owned);
        for spaced in [
            " 42",
            "42 ",
            "\t42",
            "42\u{3000}",
            " acme",
            "acme\n",
            "\u{1c}42",
            "\u{1}a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "\u{feff}42",
            "a\u{1}b",
        ] {
            assert_eq!(read(spaced), Err(ValueRefusal::Spacing), "{spaced:?}");
        }
        for number in [
            "042",
            "00",
            "+42",
            "-42",
            "-0",
            "+ 42",
            "4_2",
            "0x2A",
            "0X2a",
            "0b101010",
            "0o52",
            "42abc",
            "4.2e1",
            "42.0",
            ".42e2",
            "#2A",
            "-#2a",
            "\u{ff14}\u{ff12}",
            "\u{0664}\u{0662}",
            "4 2",
            "# 2a",
            "-# 2a",
            "#\u{2028} 2a",
            // A UUID that starts with a digit: Rails' id cast and parseInt read its leading digits.
            "550e8400-e29b-41d4-a716-446655440000",
        ] {
            assert_eq!(
                read(number),
                Err(ValueRefusal::NumberSpelling),
                "{number:?}"
            );
        }
        for uuid in [
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "urn:uuid:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
            "a-b-c-d-e",
            "f-+1-2-3-4",
            "(a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11)",
            "xa0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11y",
            "a-b-c-d-\u{ff11}",
            "a-b-c-d-\u{ff21}",
            "a0eebc99\u{669}c0b4ef8bb6d6bb9bd380a11",
            "a0eebc99\u{ff19}c0b4ef8bb6d6bb9bd380a11",
            "+a0eebc999c0b4ef8bb6d6bb9bd380a1",
            "a0eebc99_9c0b4ef8bb6d6bb9bd380a1",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd38_0a1",
            "{0xa0eebc999c0b4ef8bb6d6bb9bd380a}",
            "a-b-c-d-e-",
        ] {
            assert_eq!(read(uuid), Err(ValueRefusal::UuidSpelling), "{uuid:?}");
        }
    }

    #[test]
    fn untyped_decimals_javascript_rounds_are_refused() {
        assert_eq!(
            InputType::Untyped.read("9007199254740991").as_deref(),
            Ok("9007199254740991")
        );
        for large in [
            "9007199254740992",
            "9007199254740993",
            "18446744073709551616",
        ] {
            assert_eq!(
                InputType::Untyped.read(large),
                Err(ValueRefusal::BeyondJavaScript),
                "{large}"
            );
        }
        assert_eq!(
            InputType::Int.read("9007199254740993").as_deref(),
            Ok("9007199254740993")
        );
    }

    #[test]
    fn suffixes_name_types() {
        assert_eq!(InputType::split_suffix("id:int"), ("id", InputType::Int));
        assert_eq!(InputType::split_suffix("id:uuid"), ("id", InputType::Uuid));
        assert_eq!(InputType::split_suffix("id:str"), ("id", InputType::Str));
        assert_eq!(InputType::split_suffix("id"), ("id", InputType::Untyped));
        assert_eq!(InputType::split_suffix("a:b"), ("a:b", InputType::Untyped));
        assert_eq!(InputType::Int.to_string(), ":int");
        assert_eq!(InputType::Untyped.to_string(), "");
    }
}
