//! The pages' HTML: escaping, the layout every page shares, and small building blocks.
//! Everything dynamic goes through [`esc`]; nothing is written into a page unescaped.

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::ops::dlq::format_utc;

/// `text` safe inside HTML text and attribute values; control characters and direction
/// overrides are shown as `\uXXXX` (as `km0` prints them), not passed to the browser.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if c != '\n' && c != '\t' && crate::services::input::is_unsafe_char(c) => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` safe as one query-string value.
pub fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b));
            }
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// An epoch-ms time as UTC text, `-` for none.
pub fn time(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_owned(), format_utc)
}

/// The sections of the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Outbox, lag, dead letters and sagas at a glance.
    Overview,
    /// Dead letters.
    DeadLetters,
    /// Order sagas.
    Sagas,
    /// One order across the services.
    Trace,
}

/// A whole page: the layout, the navigation with `active` marked, and `body`.
pub fn page(title: &str, active: Section, body: &str) -> Html<String> {
    let link = |section: Section, href: &str, label: &str| {
        let current = if section == active {
            " aria-current=\"page\""
        } else {
            ""
        };
        format!("<a href=\"{href}\"{current}>{label}</a>")
    };
    let nav = [
        link(Section::Overview, "/console/", "Resumen"),
        link(Section::DeadLetters, "/console/dlq", "Mensajes muertos"),
        link(Section::Sagas, "/console/sagas", "Sagas"),
        link(Section::Trace, "/console/trace", "Traza de un pedido"),
    ]
    .join("\n      ");
    Html(format!(
        "<!doctype html>
<html lang=\"es\">
<head>
  <meta charset=\"utf-8\">
  <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">
  <title>{title} · km0</title>
  <link rel=\"stylesheet\" href=\"/console/assets/console.css\">
  <script src=\"/console/assets/console.js\" defer></script>
</head>
<body>
  <header>
    <strong>km0</strong>
    <nav>
      {nav}
    </nav>
    <form id=\"token-form\" class=\"token\" autocomplete=\"off\">
      <label>Token de operador <input type=\"password\" id=\"token\" name=\"token\"></label>
      <button type=\"submit\">Usar</button>
      <span id=\"operator\" data-testid=\"operator\"></span>
    </form>
  </header>
  <main>
    <h1>{title}</h1>
{body}
    <pre id=\"result\" data-testid=\"result\" hidden></pre>
  </main>
</body>
</html>
",
        title = esc(title),
    ))
}

/// A table with `headers` and already-escaped cells, or `empty` when there are no rows.
pub fn table(testid: &str, headers: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!(
            "<p class=\"empty\" data-testid=\"{testid}-empty\">{}</p>",
            esc(empty)
        );
    }
    let mut out = format!("<table data-testid=\"{testid}\">\n<thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>");
    out
}

/// A notice that something could not be read, inside a page that still renders.
pub fn failure(what: &str, error: &dyn std::fmt::Display) -> String {
    format!(
        "<p class=\"error\" role=\"alert\">{}: {}</p>",
        esc(what),
        esc(&error.to_string())
    )
}

/// A page that answers `status`: `message` (already HTML) where the content would be.
pub fn error_page(status: StatusCode, title: &str, active: Section, message: &str) -> Response {
    (status, page(title, active, message)).into_response()
}

/// A 400 page saying why the request is not valid.
pub fn bad_request(reason: &str) -> Response {
    error_page(
        StatusCode::BAD_REQUEST,
        "Petición no válida",
        Section::Overview,
        &format!("<p class=\"error\" role=\"alert\">{}</p>", esc(reason)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_data_is_escaped() {
        assert_eq!(
            esc("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        assert_eq!(query_value("a b/ñ"), "a%20b%2F%C3%B1");
        assert_eq!(esc("P\u{1b}[2J\u{202e}x"), "P\\u001b[2J\\u202ex");
    }

    #[test]
    fn an_empty_table_says_so() {
        assert!(table("t", &["a"], &[], "nada").contains("nada"));
        let t = table("t", &["a"], &[vec!["<b>1</b>".into()]], "nada");
        assert!(
            t.contains("<td><b>1</b></td>"),
            "cells are written as given: {t}"
        );
    }
}
