//! How names compare without letter case: ASCII case, and the Unicode case mappings that Java's
//! and .NET's case-insensitive comparisons apply too (the Kelvin sign `K` is `k`, the dotless `ı`
//! is `I`). Matching more spellings than an upstream does only fences more.

/// Whether `a` and `b` are the same text to an upstream that compares without letter case.
pub fn same_ignoring_case(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    let (mut x, mut y) = (a.chars(), b.chars());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            (Some(c), Some(d)) if same_letter(c, d) => {}
            _ => return false,
        }
    }
}

/// One character against another: equal, or equal once either is mapped to lower or upper case
/// (the full mapping, or its first character, which is the simple mapping Java uses).
fn same_letter(c: char, d: char) -> bool {
    c == d
        || c.eq_ignore_ascii_case(&d)
        || c.to_lowercase().eq(d.to_lowercase())
        || c.to_uppercase().eq(d.to_uppercase())
        || c.to_lowercase().next() == d.to_lowercase().next()
        || c.to_uppercase().next() == d.to_uppercase().next()
}

#[cfg(test)]
mod tests {
    use super::same_ignoring_case;

    #[test]
    fn ascii_and_unicode_foldings_compare_equal() {
        assert!(same_ignoring_case("Invoices", "invoices"));
        assert!(same_ignoring_case("wor\u{212A}", "work"));
        assert!(same_ignoring_case("\u{131}d", "ID"));
        assert!(same_ignoring_case("\u{130}d", "id"));
        assert!(same_ignoring_case("\u{17F}ign", "sign"));
        assert!(same_ignoring_case("CAF\u{C9}", "caf\u{E9}"));
        assert!(!same_ignoring_case("invoice", "invoices"));
        assert!(!same_ignoring_case("a", "b"));
    }
}
