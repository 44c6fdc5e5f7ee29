//! The dead-letter pages: the list a page at a time with its filters, the actions on every
//! letter a filter selects, the held letters and the latest operator actions; and one dead
//! letter with its headers, payload, history and the actions on it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use entrega::dlq::{DeadLetter, DlqFilter};
use entrega_core::{DeadClass, DeadLetterId};

use super::html::{
    bad_request, error_page, esc, failure, page, pager, prose, query_value, short_time, table,
    thousands, time, Paging, Section,
};
use super::Console;

/// Operator actions shown under the list.
const AUDIT_SHOWN: usize = 20;
/// Held dead letters listed per service.
const HELD_SHOWN: usize = 50;
/// The columns of a dead letter's row ([`letter_row`]).
const LETTER_COLUMNS: [&str; 10] = [
    "partition/offset",
    "key",
    "tipo",
    "failure",
    "code",
    "reason",
    "attempts",
    "replays",
    "dead at (UTC)",
    "state",
];

/// The query's names before they were English, accepted for one release.
const OLD_NAMES: [(&str, &str); 4] = [
    ("tipo", "type"),
    ("motivo", "reason"),
    ("clase", "failure"),
    ("estado", "state"),
];

/// `q` with the old names renamed (a new name given too wins) and the old state values
/// (`pendientes`, `todos`) read as the new ones.
fn current_names(mut q: HashMap<String, String>) -> HashMap<String, String> {
    for (old, new) in OLD_NAMES {
        if let Some(value) = q.remove(old) {
            q.entry(new.to_owned()).or_insert(value);
        }
    }
    if let Some(state) = q.get_mut("state") {
        match state.as_str() {
            "todos" => *state = "all".to_owned(),
            "pendientes" => *state = "pending".to_owned(),
            _ => {}
        }
    }
    q
}

/// The filter `q` asks for, and whether handled letters are wanted too; or why not.
fn filter_of(q: &HashMap<String, String>) -> Result<(DlqFilter, bool), String> {
    let get = |k: &str| q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let mut filter = DlqFilter::all();
    if let Some(kind) = get("type") {
        filter = filter.with_kind(kind);
    }
    if let Some(reason) = get("reason") {
        filter = filter.with_reason(reason);
    }
    if let Some(class) = get("failure") {
        match DeadClass::parse(class) {
            Some(class) => filter = filter.with_failure(class),
            None => return Err(format!("unknown kind of failure: {class}")),
        }
    }
    let all = match get("state") {
        None | Some("pending") => false,
        Some("all") => true,
        Some(other) => return Err(format!("state is `pending` or `all`, not {other:?}")),
    };
    Ok((filter, all))
}

/// `GET /console/dlq`: dead letters a page at a time, filtered by `type`, `reason` (text),
/// `failure` and `state` (`pending`, `all`), with the bulk actions on every pending one the
/// filter selects, the held letters and the latest operator actions.
#[utoipa::path(
    get,
    path = "/console/dlq",
    tag = "console",
    params(
        ("type" = Option<String>, Query, description = "Only this event type (also `tipo`)"),
        ("reason" = Option<String>, Query, description = "Only reasons containing this text (also `motivo`)"),
        ("failure" = Option<String>, Query, description = "Only this kind of failure (also `clase`)"),
        ("state" = Option<String>, Query, description = "`pending` (default) or `all` (also `estado`)"),
        ("page" = Option<usize>, Query, description = "The page, from 1 (50 letters a page)"),
    ),
    responses(
        (status = 200, description = "The dead letters page.", content_type = "text/html", body = String),
        (status = 400, description = "A filter or page that is not one.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn dead_letters(
    State(console): State<Arc<Console>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let q = current_names(q);
    let (filter, all) = match filter_of(&q) {
        Ok(found) => found,
        Err(why) => return bad_request(&why),
    };
    let paging = match Paging::from_query(&q) {
        Ok(paging) => paging,
        Err(why) => return bad_request(&why),
    };
    let mut body = filter_form(&q);
    // On RabbitMQ reading the queue holds its messages a moment: no reading every 5 s there.
    let refresh = if console.broker.is_amqp() {
        ""
    } else {
        " data-refresh=\"5\""
    };
    body.push_str(&format!("<div class=\"live\"{refresh}>\n"));
    let mut bulk = String::new();
    match console.letters.list(&filter, all).await {
        Ok(letters) => {
            let shown = paging.slice(&letters);
            let rows: Vec<Vec<String>> = shown.iter().map(letter_row).collect();
            body.push_str(&format!(
                "<p>In <code>{}</code></p>\n",
                esc(&console.letters.place())
            ));
            body.push_str(&pager(
                "dlq-pager",
                "/console/dlq",
                &q,
                paging,
                rows.len(),
                Some(letters.len()),
            ));
            body.push_str(&table(
                "dlq",
                &LETTER_COLUMNS,
                &rows,
                "No dead letter with these filters.",
            ));
            let pending = if all {
                letters.iter().filter(|l| l.is_pending()).count()
            } else {
                letters.len()
            };
            bulk = bulk_panel(&q, pending);
        }
        Err(e) => body.push_str(&failure("the dead letters could not be read", &e)),
    }
    body.push_str("</div>\n");
    // Outside the part that refreshes: a reason being typed stays.
    body.push_str(&bulk);
    body.push_str(&held_section(&console).await);
    body.push_str("<h2>Latest operator actions</h2>\n");
    match console.letters.audit(AUDIT_SHOWN).await {
        Ok(entries) => {
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    vec![
                        time(Some(e.at_ms)),
                        format!(
                            "<span data-testid=\"audit-operator\">{}</span>",
                            esc(&e.operator)
                        ),
                        format!(
                            "<span data-testid=\"audit-action\">{}{}</span>",
                            e.action.as_str(),
                            if e.dry_run { " (dry run)" } else { "" }
                        ),
                        prose(&e.filter),
                        format!("{} / {} / {}", e.matched, e.applied, e.refused),
                        prose(e.detail.as_deref().unwrap_or("")),
                    ]
                })
                .collect();
            body.push_str(&table(
                "audit",
                &[
                    "when",
                    "operator",
                    "action",
                    "selection",
                    "matched / done / refused",
                    "detail",
                ],
                &rows,
                "No action yet.",
            ));
        }
        Err(e) => body.push_str(&failure("the audit could not be read", &e)),
    }
    page("Dead letters", Section::DeadLetters, &body).into_response()
}

/// The actions on every pending letter the page's filter selects: a dry run first, which
/// shows what would happen and how many match; the action itself then names that count, and
/// the server refuses it if the selection changed meanwhile.
fn bulk_panel(q: &HashMap<String, String>, pending: usize) -> String {
    if pending == 0 {
        return String::new();
    }
    let value = |k: &str| esc(q.get(k).map_or("", |v| v.trim()));
    format!(
        "<section class=\"bulk\" data-testid=\"bulk\" data-type=\"{}\" data-reason=\"{}\" data-failure=\"{}\">\
         <h3>Every pending dead letter these filters select: <span data-testid=\"bulk-count\">{}</span></h3>\
         <div class=\"actions\">\
         <button type=\"button\" data-bulk=\"replay\">Replay all (dry run first)</button>\
         <label>Reason <input id=\"bulk-reason\" name=\"bulk-reason\"></label>\
         <button type=\"button\" data-bulk=\"discard\">Discard all (dry run first)</button>\
         <button type=\"button\" data-bulk-confirm hidden data-testid=\"bulk-confirm\"></button>\
         <button type=\"button\" data-bulk-cancel hidden data-testid=\"bulk-cancel\">Cancel</button>\
         </div></section>\n",
        value("type"),
        value("reason"),
        value("failure"),
        thousands(pending),
    )
}

/// Dead letters the broker refused, held in each consumer's database.
async fn held_section(console: &Console) -> String {
    let mut out = String::from("<h2 id=\"held\">Held dead letters</h2>\n");
    let mut rows = Vec::new();
    let mut total = 0u64;
    for (service, db) in console.held_dbs() {
        let store = db.held_letters();
        match (store.count().await, store.list(HELD_SHOWN).await) {
            (Ok(n), Ok(held)) => {
                total += n;
                rows.extend(held.iter().map(|h| {
                    vec![
                        service.to_owned(),
                        esc(&h.id.group),
                        esc(&format!(
                            "{}/{}/{}",
                            h.id.topic, h.id.partition, h.id.offset
                        )),
                        esc(&h.letter.topic),
                        esc(h.letter.key.as_deref().unwrap_or("")),
                        esc(h.letter.headers.get("tipo").unwrap_or("")),
                        thousands(h.letter.payload.len()),
                        prose(&h.refusal),
                        time(Some(h.held_at_ms)),
                    ]
                }));
            }
            (Err(e), _) | (_, Err(e)) => out.push_str(&failure(
                &format!("{service}'s held dead letters could not be read"),
                &e,
            )),
        }
    }
    out.push_str(&format!(
        "<p data-testid=\"held-total\">{} held. Once the cause is mended, \
         <code>km0 dlq send-held</code> sends them on.</p>\n",
        thousands(total as usize)
    ));
    out.push_str(&table(
        "held",
        &[
            "service",
            "group",
            "record",
            "destination",
            "key",
            "tipo",
            "bytes",
            "refused because",
            "held at",
        ],
        &rows,
        "No held dead letter.",
    ));
    out
}

fn filter_form(q: &HashMap<String, String>) -> String {
    let value = |k: &str| esc(q.get(k).map_or("", String::as_str));
    let classes: String = std::iter::once(String::new())
        .chain(DeadClass::ALL.iter().map(|c| c.as_str().to_owned()))
        .map(|c| {
            let selected = if q.get("failure") == Some(&c) {
                " selected"
            } else {
                ""
            };
            let label = if c.is_empty() { "any" } else { c.as_str() };
            format!("<option value=\"{c}\"{selected}>{label}</option>")
        })
        .collect();
    let all = if q.get("state").map(String::as_str) == Some("all") {
        " checked"
    } else {
        ""
    };
    format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/dlq\">\
         <label>Type <input name=\"type\" value=\"{}\"></label>\
         <label>Reason contains <input name=\"reason\" value=\"{}\"></label>\
         <label>Failure <select name=\"failure\">{classes}</select></label>\
         <label><input type=\"checkbox\" name=\"state\" value=\"all\"{all}> handled ones too</label>\
         <button type=\"submit\">Filter</button></form>\n",
        value("type"),
        value("reason"),
    )
}

fn letter_row(l: &DeadLetter) -> Vec<String> {
    let id = l.id.to_string();
    vec![
        format!(
            "<a href=\"/console/dlq/letter?id={}\" title=\"{}\" data-testid=\"dlq-link\">{}/{}</a>",
            query_value(&id),
            esc(&id),
            l.id.partition,
            l.id.offset
        ),
        esc(l.key.as_deref().unwrap_or("")),
        esc(l.kind.as_deref().unwrap_or("")),
        esc(l.failure.map_or("", |c| c.as_str())),
        esc(l.code.as_deref().unwrap_or("")),
        prose(&l.reason),
        l.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        l.replays.to_string(),
        short_time(l.timestamp_ms),
        format!("<span data-testid=\"dlq-state\">{}</span>", l.state()),
    ]
}

/// `GET /console/dlq/letter?id=<topic>/<partition>/<offset>`: one dead letter, its history
/// and the actions on it.
#[utoipa::path(
    get,
    path = "/console/dlq/letter",
    tag = "console",
    params(("id" = String, Query, description = "`<dlq-topic>/<partition>/<offset>`")),
    responses(
        (status = 200, description = "One dead letter, its history and actions.", content_type = "text/html", body = String),
        (status = 400, description = "No id, or not one.", content_type = "text/html", body = String),
        (status = 404, description = "No such dead letter.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn dead_letter(
    State(console): State<Arc<Console>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(raw) = q.get("id") else {
        return bad_request("the id parameter is missing");
    };
    let id: DeadLetterId = match raw.parse() {
        Ok(id) => id,
        Err(e) => return bad_request(&format!("not a dead letter id: {e}")),
    };
    let (letter, history) = match console.letters.show(&id).await {
        Ok(found) => found,
        Err(e) => {
            let (status, what) = if e.is_usage() {
                (StatusCode::NOT_FOUND, "no such dead letter")
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the dead letter could not be read",
                )
            };
            let message = failure(what, &e);
            return error_page(status, "Dead letter", Section::DeadLetters, &message);
        }
    };
    let mut body = format!(
        "<dl class=\"figures\" data-testid=\"letter\">\
         <dt>id</dt><dd>{}</dd><dt>state</dt><dd data-testid=\"letter-state\">{}</dd>\
         <dt>key</dt><dd>{}</dd><dt>tipo</dt><dd>{}</dd><dt>id_evento</dt><dd>{}</dd>\
         <dt>failure</dt><dd>{}</dd><dt>code</dt><dd>{}</dd><dt>reason</dt><dd>{}</dd>\
         <dt>attempts</dt><dd>{}</dd><dt>replays</dt><dd>{}</dd>\
         <dt>origin</dt><dd>{} / {} / {} (group {})</dd><dt>dead at</dt><dd>{}</dd></dl>\n",
        esc(&letter.id.to_string()),
        letter.state(),
        esc(letter.key.as_deref().unwrap_or("")),
        esc(letter.kind.as_deref().unwrap_or("")),
        esc(letter.event_id.as_deref().unwrap_or("")),
        esc(letter.failure.map_or("", |c| c.as_str())),
        esc(letter.code.as_deref().unwrap_or("")),
        esc(&letter.reason),
        letter
            .attempts
            .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        letter.replays,
        esc(&letter.origin.topic),
        letter
            .origin
            .partition
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
        letter
            .origin
            .offset
            .map_or_else(|| "-".to_owned(), |o| o.to_string()),
        esc(letter.origin.group.as_deref().unwrap_or("-")),
        time(Some(letter.timestamp_ms)),
    );
    if letter.is_pending() {
        body.push_str(&format!(
            "<section class=\"actions\" data-id=\"{}\">\
             <button type=\"button\" data-action=\"replay-dry\">Replay (dry run)</button>\
             <button type=\"button\" data-action=\"replay\">Replay</button>\
             <label>Reason <input id=\"discard-reason\" name=\"reason\"></label>\
             <button type=\"button\" data-action=\"discard\">Discard</button></section>\n",
            esc(&letter.id.to_string())
        ));
    } else if let Some(mark) = &letter.mark {
        body.push_str(&format!(
            "<p data-testid=\"letter-mark\">{} by {} at {}{}</p>\n",
            mark.state.as_str(),
            esc(&mark.operator),
            time(Some(mark.at_ms)),
            mark.reason
                .as_deref()
                .map(|r| format!(": {}", esc(r)))
                .unwrap_or_default()
        ));
    }
    let headers: Vec<Vec<String>> = letter
        .headers
        .iter()
        .map(|(n, v)| vec![format!("<code>{}</code>", esc(n)), prose(v)])
        .collect();
    body.push_str("<h2>Headers</h2>\n");
    body.push_str(&table(
        "letter-headers",
        &["name", "value"],
        &headers,
        "No headers.",
    ));
    let payload = serde_json::to_string_pretty(&letter.payload_json()).unwrap_or_default();
    body.push_str(&format!(
        "<h2>Payload</h2>\n<pre data-testid=\"letter-payload\">{}</pre>\n",
        esc(&payload)
    ));
    let rows: Vec<Vec<String>> = history.iter().map(letter_row).collect();
    body.push_str("<h2>The event's history</h2>\n");
    body.push_str(&table("letter-history", &LETTER_COLUMNS, &rows, ""));
    page("Dead letter", Section::DeadLetters, &body).into_response()
}
