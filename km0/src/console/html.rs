//! The pages' HTML: escaping, the layout every page shares, and small building blocks.
//! Everything dynamic goes through [`esc`]; nothing is written into a page unescaped.

use std::collections::HashMap;
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

/// Free text (a reason, an error, a detail) for a table cell: escaped, and free to wrap
/// between words, where the cells around it keep to one line.
pub fn prose(text: &str) -> String {
    format!("<span class=\"prose\">{}</span>", esc(text))
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

/// An epoch-ms time as `YYYY-MM-DD HH:MM:SS` UTC, for a list's narrow column.
pub fn short_time(ms: i64) -> String {
    let full = format_utc(ms);
    full.get(..19)
        .map_or(full.clone(), |s| s.replacen('T', " ", 1))
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
        link(Section::Overview, "/console/", "Overview"),
        link(Section::DeadLetters, "/console/dlq", "Dead letters"),
        link(Section::Sagas, "/console/sagas", "Sagas"),
        link(Section::Trace, "/console/trace", "Trace of an order"),
    ]
    .join("\n      ");
    Html(format!(
        "<!doctype html>
<html lang=\"en\">
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
      <label>Operator token <input type=\"password\" id=\"token\" name=\"token\"></label>
      <button type=\"submit\">Use</button>
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

/// Rows shown on one page of a list.
pub const PER_PAGE: usize = 50;

/// Which page of a list is asked for: `?page=N`, counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging {
    /// The page, from 1.
    pub page: usize,
}

impl Paging {
    /// The page `q` asks for (the first when it names none); a `page` that is not a positive
    /// number is refused with why.
    pub fn from_query(q: &HashMap<String, String>) -> Result<Self, String> {
        match q.get("page").map(|p| p.trim()).filter(|p| !p.is_empty()) {
            None => Ok(Self { page: 1 }),
            Some(p) => match p.parse::<usize>() {
                Ok(page) if (1..=1_000_000).contains(&page) => Ok(Self { page }),
                _ => Err(format!("page must be a number from 1 on, not {p:?}")),
            },
        }
    }

    /// How many rows come before this page.
    pub fn offset(self) -> usize {
        (self.page - 1).saturating_mul(PER_PAGE)
    }

    /// This page's rows of `rows`.
    pub fn slice<T>(self, rows: &[T]) -> &[T] {
        let start = self.offset().min(rows.len());
        let end = start.saturating_add(PER_PAGE).min(rows.len());
        &rows[start..end]
    }
}

/// "Showing 51–100 of 2,570" and links to the pages around, keeping `q`'s other parameters;
/// `total` is `None` when unknown (then "Next" shows while a page is full).
pub fn pager(
    testid: &str,
    path: &str,
    q: &HashMap<String, String>,
    paging: Paging,
    shown: usize,
    total: Option<usize>,
) -> String {
    let mut kept: Vec<(&String, &String)> = q
        .iter()
        .filter(|(k, v)| k.as_str() != "page" && !v.trim().is_empty())
        .collect();
    kept.sort();
    let href = |page: usize| {
        let mut parts: Vec<String> = kept
            .iter()
            .map(|(k, v)| format!("{}={}", query_value(k), query_value(v)))
            .collect();
        parts.push(format!("page={page}"));
        format!("{path}?{}", parts.join("&amp;"))
    };
    let first = if shown == 0 { 0 } else { paging.offset() + 1 };
    let last = if shown == 0 {
        0
    } else {
        paging.offset() + shown
    };
    let mut out = format!("<nav class=\"pager\" data-testid=\"{testid}\">");
    match total {
        // Past the end (the list shrank since the link was made): say so, and lead back.
        Some(total) if shown == 0 && paging.page > 1 => {
            let pages = total.div_ceil(PER_PAGE).max(1);
            let _ = writeln!(
                out,
                "<span data-testid=\"{testid}-range\">Page {} is past the end: {} in all</span> \
                 <a href=\"{}\" data-testid=\"{testid}-last\">Last page</a></nav>",
                paging.page,
                thousands(total),
                href(pages)
            );
            return out;
        }
        Some(total) => {
            let _ = write!(
                out,
                "<span data-testid=\"{testid}-range\">Showing {} to {} of <strong data-testid=\"{testid}-total\">{}</strong></span>",
                thousands(first),
                thousands(last),
                thousands(total)
            );
        }
        None => {
            let _ = write!(
                out,
                "<span data-testid=\"{testid}-range\">Showing {} to {}</span>",
                thousands(first),
                thousands(last)
            );
        }
    }
    if paging.page > 1 {
        let _ = write!(
            out,
            " <a href=\"{}\" rel=\"prev\" data-testid=\"{testid}-prev\">Previous</a>",
            href(paging.page - 1)
        );
    }
    let more = total.map_or(shown == PER_PAGE, |total| last < total);
    if more {
        let _ = write!(
            out,
            " <a href=\"{}\" rel=\"next\" data-testid=\"{testid}-next\">Next</a>",
            href(paging.page + 1)
        );
    }
    out.push_str("</nav>\n");
    out
}

/// `n` with thousands separated by commas.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A table with `headers` and already-escaped cells, or `empty` when there are no rows.
pub fn table(testid: &str, headers: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!(
            "<p class=\"empty\" data-testid=\"{testid}-empty\">{}</p>",
            esc(empty)
        );
    }
    let mut out = format!("<div class=\"table\"><table data-testid=\"{testid}\">\n<thead><tr>");
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
    out.push_str("</tbody>\n</table></div>");
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
        "Bad request",
        Section::Overview,
        &format!("<p class=\"error\" role=\"alert\">{}</p>", esc(reason)),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
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
    fn pages_slice_and_link_with_the_other_parameters_kept() {
        let q: HashMap<String, String> = [("type", "pedido.creado"), ("page", "2"), ("x", "")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let paging = Paging::from_query(&q).unwrap();
        assert_eq!(paging.offset(), PER_PAGE);
        let rows: Vec<usize> = (0..120).collect();
        assert_eq!(paging.slice(&rows), &rows[50..100]);
        assert!(Paging { page: 9 }.slice(&rows).is_empty());
        let nav = pager("p", "/console/dlq", &q, paging, 50, Some(2570));
        assert!(nav.contains("Showing 51 to 100 of"), "{nav}");
        assert!(nav.contains(">2,570<"), "{nav}");
        assert!(
            nav.contains("/console/dlq?type=pedido.creado&amp;page=1"),
            "{nav}"
        );
        assert!(
            nav.contains("/console/dlq?type=pedido.creado&amp;page=3"),
            "{nav}"
        );
        let last = pager("p", "/x", &q, Paging { page: 3 }, 20, Some(120));
        assert!(!last.contains("rel=\"next\""), "{last}");
        let past = pager("p", "/x", &q, Paging { page: 9 }, 0, Some(120));
        assert!(
            past.contains("Page 9 is past the end: 120 in all"),
            "{past}"
        );
        assert!(past.contains("/x?type=pedido.creado&amp;page=3"), "{past}");
        let none = pager("p", "/x", &q, Paging { page: 1 }, 0, Some(0));
        assert!(none.contains("Showing 0 to 0 of"), "{none}");
        for bad in ["0", "-1", "x", "99999999999"] {
            let q = HashMap::from([("page".to_owned(), bad.to_owned())]);
            assert!(Paging::from_query(&q).is_err(), "{bad}");
        }
        assert_eq!(short_time(1_764_000_000_123), "2025-11-24 16:00:00");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn an_empty_table_says_so() {
        assert!(table("t", &["a"], &[], "nothing").contains("nothing"));
        let t = table("t", &["a"], &[vec!["<b>1</b>".into()]], "nothing");
        assert!(
            t.contains("<td><b>1</b></td>"),
            "cells are written as given: {t}"
        );
    }
}
