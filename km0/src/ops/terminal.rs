//! What reaches an operator's terminal: text read from databases and brokers may hold what
//! others wrote (a message's key, an order id from an older client), and a control character
//! in it would act on the terminal (clear it, move the cursor, retitle the window) instead of
//! being shown. Everything the operator commands print goes through [`safe`].

use std::borrow::Cow;

use crate::services::input::is_unsafe_char;

/// `text` with every control character but newline and tab, and every direction override,
/// written as a `\uXXXX` escape: shown, never acted on. The escape is JSON's own, so JSON
/// output stays valid (outside strings, JSON holds none of these characters).
pub fn safe(text: &str) -> Cow<'_, str> {
    let unsafe_here = |c: char| c != '\n' && c != '\t' && is_unsafe_char(c);
    if !text.chars().any(unsafe_here) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_here(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Prints `text` to stdout through [`safe`].
pub fn print(text: &str) {
    print!("{}", safe(text));
}

/// Prints `text` and a newline to stdout through [`safe`].
pub fn println(text: &str) {
    println!("{}", safe(text));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert!(matches!(safe("P-1\tok\n"), Cow::Borrowed(_)));
        assert_eq!(safe("P-1\u{1b}[2J"), "P-1\\u001b[2J");
        assert_eq!(safe("a\u{9b}b\u{202e}c\u{7f}"), "a\\u009bb\\u202ec\\u007f");
        // JSON stays JSON.
        let json = serde_json::json!({"id": "x\u{9b}y"}).to_string();
        let shown = safe(&json);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["id"], "x\u{9b}y");
    }
}
