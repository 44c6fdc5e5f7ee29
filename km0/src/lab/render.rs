//! The lab's output: the list of scenarios, and one ledger per side as a table or as JSON.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{Ledger, Outcome, Scenario};

/// The scenarios, one paragraph each.
pub(super) fn list(all: &[Scenario]) -> String {
    let mut out = String::new();
    for s in all {
        let _ = writeln!(
            out,
            "{:>2}. {}  (seed section {}; on {})",
            s.number,
            s.name,
            s.section,
            s.needs.name()
        );
        let _ = writeln!(out, "    naive:   {}", s.naive);
        let _ = writeln!(out, "    pattern: {}", s.pattern);
        let _ = writeln!(out, "    {}", s.explains);
    }
    out
}

const COLUMNS: [&str; 9] = [
    "placed",
    "applied",
    "lost",
    "twice",
    "out of order",
    "stuck",
    "held up",
    "ghosts",
    "wrong",
];

fn figures(l: &Ledger) -> [u64; 9] {
    [
        l.placed,
        l.applied,
        l.lost,
        l.doubled,
        l.out_of_order,
        l.stuck,
        l.held_up,
        l.ghosts,
        l.wrong,
    ]
}

/// Each scenario: what it shows, then a ledger per side and what the fault did.
pub(super) fn ledgers(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for o in outcomes {
        let s = o.scenario;
        let _ = writeln!(out, "{}. {} (seed section {})", s.number, s.name, s.section);
        let _ = writeln!(out, "   {}", s.explains);
        if let Some(reason) = &o.skipped {
            let _ = writeln!(out, "   SKIPPED: {reason}\n");
            continue;
        }
        let _ = write!(out, "   {:<8}", "");
        for c in COLUMNS {
            let _ = write!(out, "  {c:>12}");
        }
        out.push('\n');
        for (side, ledger) in [("naive", &o.naive), ("pattern", &o.pattern)] {
            let _ = write!(out, "   {side:<8}");
            for n in figures(ledger) {
                let _ = write!(out, "  {n:>12}");
            }
            out.push('\n');
        }
        let _ = writeln!(out, "   fault (naive):   {}", o.naive.fault);
        let _ = writeln!(out, "   fault (pattern): {}", o.pattern.fault);
        let verdict = if o.shows_the_point() {
            "the naive side failed, the pattern kept every order"
        } else {
            "NOT SHOWN: the naive side must fail and the pattern must not"
        };
        let _ = writeln!(out, "   {verdict}\n");
    }
    out
}

/// Every outcome as JSON, with the seed.
pub(super) fn to_json(outcomes: &[Outcome], seed: u64) -> Value {
    json!({
        "seed": seed,
        "scenarios": outcomes.iter().map(|o| json!({
            "number": o.scenario.number,
            "name": o.scenario.name,
            "section": o.scenario.section,
            "naive": o.naive,
            "pattern": o.pattern,
            "runs_on": o.scenario.needs,
            "shown": o.skipped.is_none() && o.shows_the_point(),
            "skipped": o.skipped,
        })).collect::<Vec<_>>(),
    })
}
