//! How the text log writes an event's fields: as tracing's default does (`message` first, then
//! `name=value`), with every control character, newline included, and every direction
//! override written as a `\uXXXX` escape. A field may carry what others wrote (a record's key,
//! a reason holding a product name from another producer's message): raw, an escape sequence
//! would act on the operator's terminal, and a newline would forge a log line. (The JSON log
//! escapes control characters by JSON's own rules.)

use std::fmt::Write as _;

use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::fmt::format::{debug_fn, FormatFields};

use crate::services::input::is_unsafe_char;

/// `text` with each unsafe character escaped.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_unsafe_char(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// The text log's field formatter.
pub fn escaped_fields() -> impl for<'writer> FormatFields<'writer> + Send + Sync + 'static {
    debug_fn(|writer, field, value| {
        let text = escaped(&format!("{value:?}"));
        if field.name() == "message" {
            write!(writer, "{text}")
        } else {
            write!(writer, "{field}={text}")
        }
    })
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_newlines_and_overrides_are_escaped() {
        assert_eq!(
            escaped("a\u{1b}[2J\nforged\u{202e}x\u{7}"),
            "a\\u001b[2J\\u000aforged\\u202ex\\u0007"
        );
        assert_eq!(escaped("plain ñ €"), "plain ñ €");
    }
}
