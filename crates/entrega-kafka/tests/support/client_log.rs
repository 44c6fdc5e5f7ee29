//! librdkafka's own log, kept in memory so that a failed scenario can show what the client
//! did with its topics (which batch went with which sequence numbers, retries, epoch bumps).
//!
//! rdkafka reports its log through `tracing` (target `librdkafka`); [`install`] sets a
//! subscriber that keeps those lines, and [`publishing`] returns the ones about publishing to a scenario's topics.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// How many lines are kept; older ones are dropped first.
const KEPT: usize = 200_000;

/// The debug contexts to turn on in the clients whose log is kept: the idempotent producer's
/// state (`eos`), every message batch (`msg`) and topic metadata (`topic`).
pub const DEBUG_CONTEXTS: &str = "eos,msg,topic";

struct Lines {
    started: Instant,
    lines: Mutex<VecDeque<String>>,
}

static LINES: OnceLock<Lines> = OnceLock::new();

/// Starts keeping librdkafka's lines; later calls do nothing.
pub fn install() {
    let mut first = false;
    LINES.get_or_init(|| {
        first = true;
        Lines {
            started: Instant::now(),
            lines: Mutex::new(VecDeque::new()),
        }
    });
    if first {
        let _ = tracing_subscriber::registry().with(Keep).try_init();
    }
}

/// Facilities of a consumer's fetching and positions: left out of an account of publishing.
const CONSUMER_FACILITIES: &[&str] = &[
    "FETCH",
    "FETCHADD",
    "FETCHDEC",
    "CONSUME",
    "CONSUMER",
    "BARRIER",
    "OP",
    "PARTSTATE",
    "STORETERM",
    "DESP",
    "DESIRED",
    "OFFSET",
    "SEEK",
    "ASSIGN",
    "ASSIGNMENT",
    "CGRP",
];

/// Words of the rare client-wide producer events (epoch bumps, sequence errors, fatal
/// errors), kept even though they name no topic.
const PRODUCER_EVENTS: &[&str] = &["DRAIN", "ERRSEQ", "DUPSEQ", "bump", "fatal", "Fatal"];

/// librdkafka's account of publishing to topics whose names end in `suffix`: the lines
/// naming them (without the consumers' fetch lines) and the client-wide producer events, the
/// first `max` of them, shortened (no thread and broker prefix, topics without the suffix).
pub fn publishing(suffix: &str, max: usize) -> Vec<String> {
    kept(max, |line| {
        let facility = line.split_whitespace().nth(3).unwrap_or("");
        (line.contains(suffix)
            && !CONSUMER_FACILITIES.contains(&facility)
            && !line.contains("Skip offset"))
            || PRODUCER_EVENTS.iter().any(|w| line.contains(w))
    })
    .into_iter()
    .map(|line| shorten(&line, suffix))
    .collect()
}

/// `line` without `librdkafka: `, its `[thrd:...]: ` and `host:port/id: ` prefixes, and
/// with `suffix` removed from topic names.
fn shorten(line: &str, suffix: &str) -> String {
    let line = line.replacen("librdkafka: ", "", 1).replace(suffix, "");
    let Some((head, rest)) = line.split_once(" [thrd:") else {
        return line;
    };
    let rest = rest.split_once("]: ").map_or(rest, |(_, r)| r);
    let rest = match rest.split_once(": ") {
        Some((broker, r)) if broker.contains(':') && !broker.contains(' ') => r,
        _ => rest,
    };
    format!("{head} {rest}")
}

/// The first `max` kept lines for which `keep` holds, oldest first.
fn kept(max: usize, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let Some(kept) = LINES.get() else {
        return Vec::new();
    };
    let lines = kept
        .lines
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    lines
        .iter()
        .filter(|l| keep(l))
        .take(max)
        .cloned()
        .collect()
}

struct Keep;

impl<S: Subscriber> Layer<S> for Keep {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != "librdkafka" {
            return;
        }
        let Some(kept) = LINES.get() else {
            return;
        };
        let mut text = Text(String::new());
        event.record(&mut text);
        let line = format!("{:>7} ms {}", kept.started.elapsed().as_millis(), text.0);
        let mut lines = kept
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() == KEPT {
            lines.pop_front();
        }
        lines.push_back(line);
    }
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}
