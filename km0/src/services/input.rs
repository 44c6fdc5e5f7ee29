//! What customer input may hold, checked where it enters (the HTTP APIs): identifiers of a
//! safe alphabet, which may go into URLs, file names and operators' terminals as they are,
//! and free text without control or direction-override characters.

/// Longest identifier accepted (order, customer, market, product, card token).
pub const MAX_ID_LEN: usize = 64;

/// The alphabet of identifiers, for people: what [`id_problem`] accepts.
pub const ID_ALPHABET: &str = "1 to 64 of A-Z a-z 0-9 and . _ : -, starting with a letter or digit";

/// Why `value` is not an identifier, or `None` when it is one: 1 to [`MAX_ID_LEN`]
/// characters of ASCII letters, digits, `.`, `_`, `:` and `-`, the first a letter or digit
/// (so no `..`, `/` or space can make a path of it).
pub fn id_problem(value: &str) -> Option<String> {
    let first_ok = value
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    let all_ok = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if first_ok && all_ok && value.len() <= MAX_ID_LEN {
        None
    } else {
        Some(format!("must be {ID_ALPHABET}"))
    }
}

/// Whether `c` would act on a terminal or reorder what is shown rather than be shown:
/// control characters (C0, DEL, C1) and Unicode's bidirectional overrides and isolates.
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Why free text `value` is refused, or `None`: it may hold anything printable.
pub fn text_problem(value: &str) -> Option<&'static str> {
    value
        .chars()
        .any(is_unsafe_char)
        .then_some("must not contain control or direction-override characters")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_of_a_safe_alphabet() {
        for good in [
            "P-2026-000123",
            "queso-curado",
            "tok_visa",
            "a",
            "x.y:z",
            &"n".repeat(64),
        ] {
            assert_eq!(id_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "P 15",
            "P-15/../x",
            "../x",
            "-P",
            ".hidden",
            "P\u{1b}[2J",
            "Pé",
            &"n".repeat(65),
        ] {
            assert!(id_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn free_text_may_hold_anything_printable() {
        assert_eq!(text_problem("Carrer de l'Àngel, 3 · 2n"), None);
        for bad in [
            "a\u{1b}[2Jb",
            "tab\there",
            "del\u{7f}",
            "csi\u{9b}",
            "rtl\u{202e}x",
        ] {
            assert!(text_problem(bad).is_some(), "{bad:?}");
        }
    }
}
