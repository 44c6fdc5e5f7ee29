//! How `km0 dlq` prints: tables for people, JSON for machines.

use std::fmt::Write as _;

use entrega::dlq::{ActionReport, DeadLetter, DlqStats};
use entrega_core::DlqAuditEntry;
use serde_json::{json, Value};

use super::time::format_utc;

/// One dead letter as a JSON object (the rows of `list --json` and `show --json`).
pub fn letter_json(l: &DeadLetter) -> Value {
    let mark = l.mark.as_ref();
    json!({
        "id": l.id.to_string(),
        "topic": l.id.topic,
        "partition": l.id.partition,
        "offset": l.id.offset,
        "key": l.key,
        "tipo": l.kind,
        "motivo": l.reason,
        "class": l.class(),
        "failure": l.failure.map(|c| c.as_str()),
        "codigo": l.code,
        "attempts": l.attempts,
        "replays": l.replays,
        "event_id": l.event_id,
        "origin": l.origin,
        "dead_lettered_at_ms": l.timestamp_ms,
        "dead_lettered_at": format_utc(l.timestamp_ms),
        "state": l.state(),
        "state_at_ms": mark.map(|m| m.at_ms),
        "operator": mark.map(|m| m.operator.clone()),
        "reason": mark.and_then(|m| m.reason.clone()),
    })
}

/// `show --json`: the dead letter, its headers and envelope, and its history.
pub fn show_json(letter: &DeadLetter, history: &[DeadLetter]) -> Value {
    let headers: Vec<Value> = letter.headers.iter().map(|(n, v)| json!([n, v])).collect();
    json!({
        "dead_letter": letter_json(letter),
        "headers": headers,
        "envelope": letter.payload_json(),
        "history": history.iter().map(letter_json).collect::<Vec<_>>(),
    })
}

/// The `list` table.
pub fn list_table(letters: &[DeadLetter]) -> String {
    if letters.is_empty() {
        return "no dead letters\n".to_owned();
    }
    let mut out = format!(
        "{:<28} {:<12} {:<18} {:>8} {:>7} {:<9} {:<24} motivo\n",
        "id", "key", "tipo", "attempts", "replays", "state", "dead-lettered at"
    );
    for l in letters {
        let attempts = l.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string());
        let _ = writeln!(
            out,
            "{:<28} {:<12} {:<18} {:>8} {:>7} {:<9} {:<24} {}",
            l.id.to_string(),
            l.key.as_deref().unwrap_or("-"),
            l.kind.as_deref().unwrap_or("-"),
            attempts,
            l.replays,
            l.state(),
            format_utc(l.timestamp_ms),
            l.reason
        );
    }
    out
}

/// The `show` text.
pub fn show_text(letter: &DeadLetter, history: &[DeadLetter]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "dead letter {}", letter.id);
    let o = &letter.origin;
    let place = |p: Option<i64>| p.map_or_else(|| "?".to_owned(), |v| v.to_string());
    let _ = writeln!(
        out,
        "  from        {} partition {} offset {} (group {})",
        o.topic,
        place(o.partition.map(i64::from)),
        place(o.offset),
        o.group.as_deref().unwrap_or("?")
    );
    let _ = writeln!(
        out,
        "  key         {}",
        letter.key.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        out,
        "  tipo        {}",
        letter.kind.as_deref().unwrap_or("-")
    );
    let _ = writeln!(out, "  motivo      {}", letter.reason);
    let attempts = letter
        .attempts
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    let _ = writeln!(out, "  attempts    {attempts}");
    let _ = writeln!(out, "  replays     {}", letter.replays);
    let _ = writeln!(out, "  written at  {}", format_utc(letter.timestamp_ms));
    let _ = write!(out, "  state       {}", letter.state());
    if let Some(m) = &letter.mark {
        let _ = write!(out, " by {} at {}", m.operator, format_utc(m.at_ms));
        if let Some(r) = &m.reason {
            let _ = write!(out, ": {r}");
        }
    }
    out.push_str("\nheaders\n");
    for (name, value) in letter.headers.iter() {
        let _ = writeln!(out, "  {name}: {value}");
    }
    let envelope = serde_json::to_string_pretty(&letter.payload_json()).unwrap_or_default();
    let _ = writeln!(out, "envelope\n{envelope}");
    out.push_str("history (dead letters of the same event)\n");
    for h in history {
        let _ = writeln!(
            out,
            "  {} {} replays={} {} {}",
            format_utc(h.timestamp_ms),
            h.id,
            h.replays,
            h.state(),
            h.reason
        );
    }
    out
}

/// The `stats` text.
pub fn stats_text(stats: &DlqStats) -> String {
    let mut out = String::new();
    for t in &stats.topics {
        let c = &t.counts;
        let _ = writeln!(
            out,
            "{} (from {}): {} pending, {} replayed, {} discarded, {} total",
            t.topic, t.origin_topic, c.pending, c.replayed, c.discarded, c.total
        );
        for (title, rows) in [("by class", &t.by_class), ("by motivo", &t.by_reason)] {
            let _ = writeln!(out, "  {title}");
            for row in rows {
                let r = &row.counts;
                let _ = writeln!(
                    out,
                    "    {:>7} pending {:>7} replayed {:>7} discarded  {}",
                    r.pending, r.replayed, r.discarded, row.reason
                );
            }
        }
        let committed = t
            .retry
            .committed
            .map_or_else(|| "-".to_owned(), |c| c.to_string());
        let _ = writeln!(
            out,
            "  retry topic {}: depth {} (end {}, committed {committed})",
            t.retry.topic, t.retry.depth, t.retry.end
        );
    }
    out
}

/// What a replay or discard did, for people.
pub fn action_text(report: &ActionReport) -> String {
    let verb = match (report.action.as_str(), report.dry_run) {
        ("replay", true) => "would replay",
        ("replay", false) => "replayed",
        (_, true) => "would discard",
        _ => "discarded",
    };
    let mut out = format!(
        "{}matched {}, {verb} {}, refused {}\n",
        if report.dry_run { "dry run: " } else { "" },
        report.matched,
        report.applied.len(),
        report.refused.len()
    );
    for a in &report.applied {
        let _ = writeln!(
            out,
            "  {verb} {} -> {} (key {}, replays {})",
            a.id,
            a.topic,
            a.key.as_deref().unwrap_or("-"),
            a.replays
        );
    }
    for r in &report.refused {
        let _ = writeln!(out, "  refused {}: {}", r.id, r.reason);
    }
    if report.dry_run && report.matched > 0 {
        let _ = writeln!(
            out,
            "selection {0}: to act on exactly these, run it again with --expect {0}",
            report.selection
        );
    }
    out
}

/// The audit, newest first.
pub fn audit_json(entries: &[DlqAuditEntry]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| {
                json!({
                    "at_ms": e.at_ms, "at": format_utc(e.at_ms), "operator": e.operator,
                    "action": e.action.as_str(), "filter": e.filter, "dry_run": e.dry_run,
                    "matched": e.matched, "applied": e.applied, "refused": e.refused,
                    "detail": e.detail,
                })
            })
            .collect(),
    )
}

/// The audit as lines.
pub fn audit_text(entries: &[DlqAuditEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        let _ = writeln!(
            out,
            "{} {} {}{} matched={} applied={} refused={} [{}] {}",
            format_utc(e.at_ms),
            e.operator,
            e.action.as_str(),
            if e.dry_run { " (dry run)" } else { "" },
            e.matched,
            e.applied,
            e.refused,
            e.filter,
            e.detail.as_deref().unwrap_or("")
        );
    }
    out
}
