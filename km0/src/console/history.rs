//! The overview's chart: every service's outbox backlog and every group's lag, summed,
//! sampled by the process that serves the console every [`EVERY`] while someone watches the
//! overview, over the last [`KEPT`] samples, and drawn as an inline SVG (no script, no
//! external asset).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use super::html::thousands;
use super::Console;

/// How often a sample is taken.
pub const EVERY: Duration = Duration::from_secs(10);
/// Samples kept: fifteen minutes at one every ten seconds.
pub const KEPT: usize = 90;

/// One sample; a figure that could not be read is `None` (a gap in its line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When, epoch milliseconds.
    pub at_ms: i64,
    /// Outbox rows not yet published, every service's.
    pub backlog: Option<u64>,
    /// Records (or ready messages, on RabbitMQ) not yet consumed, every group's.
    pub lag: Option<u64>,
}

/// The latest samples, oldest first, and when the overview was last asked for.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
    /// Epoch ms of the overview's last request; 0 before the first.
    viewed_ms: AtomicI64,
}

impl History {
    /// Notes that the overview was asked for at `now_ms`: sampling goes on for the span the
    /// chart shows after it.
    pub fn viewed(&self, now_ms: i64) {
        self.viewed_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Whether someone looked at the overview within the span the chart shows: nobody
    /// watching, nothing is sampled (reading every group's lag is not free on Kafka).
    pub fn watched(&self, now_ms: i64) -> bool {
        let viewed = self.viewed_ms.load(Ordering::Relaxed);
        let span = i64::try_from((EVERY * KEPT as u32).as_millis()).unwrap_or(i64::MAX);
        viewed > 0 && now_ms.saturating_sub(viewed) <= span
    }

    /// Keeps `sample`, forgetting the oldest beyond [`KEPT`].
    pub fn record(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back(sample);
        while samples.len() > KEPT {
            samples.pop_front();
        }
    }

    /// The samples kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.iter().copied().collect()
    }
}

/// Samples the console's figures every [`EVERY`] while the overview is watched
/// ([`History::watched`]), until the console is dropped.
pub fn spawn_sampler(console: Weak<Console>) {
    tokio::spawn(async move {
        loop {
            let Some(alive) = console.upgrade() else {
                return;
            };
            if alive.history.watched(entrega_core::now_ms()) {
                let sample = super::overview::sample(&alive).await;
                alive.history.record(sample);
            }
            drop(alive);
            tokio::time::sleep(EVERY).await;
        }
    });
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 140.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 20.0;
const TOP: f64 = 8.0;

/// The chart of `samples` as SVG markup: backlog and lag against time, one scale from 0 to the
/// largest figure shown.
pub fn chart(samples: &[Sample]) -> String {
    if samples.len() < 2 {
        return "<p class=\"empty\" data-testid=\"chart-empty\">The chart fills in as samples \
                are taken: one every 10 s while this page is watched.</p>"
            .to_owned();
    }
    let first = samples.first().map_or(0, |s| s.at_ms);
    let last = samples.last().map_or(0, |s| s.at_ms);
    let span = (last - first).max(1) as f64;
    let top = samples
        .iter()
        .flat_map(|s| [s.backlog, s.lag])
        .flatten()
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |at: i64| LEFT + (at - first) as f64 / span * (WIDTH - LEFT - 8.0);
    let y = |v: u64| TOP + (1.0 - v as f64 / top as f64) * (HEIGHT - TOP - BOTTOM);
    let line = |pick: fn(&Sample) -> Option<u64>, class: &str, testid: &str| {
        // One polyline per run of readable samples.
        let mut out = String::new();
        let mut run: Vec<String> = Vec::new();
        let flush = |run: &mut Vec<String>, out: &mut String| {
            if run.len() > 1 {
                let _ = write!(
                    out,
                    "<polyline class=\"{class}\" data-testid=\"{testid}\" points=\"{}\"/>",
                    run.join(" ")
                );
            }
            run.clear();
        };
        for s in samples {
            match pick(s) {
                Some(v) => run.push(format!("{:.1},{:.1}", x(s.at_ms), y(v))),
                None => flush(&mut run, &mut out),
            }
        }
        flush(&mut run, &mut out);
        out
    };
    let minutes = (span / 60_000.0).round().max(1.0);
    let now = samples.last().copied().unwrap_or(Sample {
        at_ms: 0,
        backlog: None,
        lag: None,
    });
    let figure = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| thousands(v as usize));
    format!(
        "<figure class=\"chart\" data-testid=\"chart\">\
         <svg viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"Outbox backlog and consumer lag over the last {minutes} minutes\">\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{bottom:.1}\" x2=\"{right}\" y2=\"{bottom:.1}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{bottom:.1}\"/>\
         <text x=\"{label_x}\" y=\"{top_label:.1}\" text-anchor=\"end\">{top_text}</text>\
         <text x=\"{label_x}\" y=\"{bottom:.1}\" text-anchor=\"end\">0</text>\
         <text x=\"{LEFT}\" y=\"{HEIGHT}\">{minutes} min ago</text>\
         <text x=\"{right}\" y=\"{HEIGHT}\" text-anchor=\"end\">now</text>\
         {backlog}{lag}</svg>\
         <figcaption><span class=\"key backlog\"></span>Outbox backlog <strong data-testid=\"chart-backlog\">{now_backlog}</strong> \
         <span class=\"key lag\"></span>Consumer lag <strong data-testid=\"chart-lag\">{now_lag}</strong> \
         <span class=\"muted\">({count} samples, one every {every} s)</span></figcaption></figure>",
        bottom = HEIGHT - BOTTOM,
        right = WIDTH - 8.0,
        label_x = LEFT - 6.0,
        top_label = TOP + 8.0,
        top_text = thousands(top as usize),
        backlog = line(|s| s.backlog, "backlog", "chart-backlog-line"),
        lag = line(|s| s.lag, "lag", "chart-lag-line"),
        now_backlog = figure(now.backlog),
        now_lag = figure(now.lag),
        count = samples.len(),
        every = EVERY.as_secs(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: i64, backlog: Option<u64>, lag: Option<u64>) -> Sample {
        Sample {
            at_ms,
            backlog,
            lag,
        }
    }

    #[test]
    fn only_the_latest_samples_are_kept() {
        let history = History::default();
        for n in 0..(KEPT as i64 + 10) {
            history.record(sample(n, Some(1), Some(2)));
        }
        let kept = history.samples();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at_ms, 10);
    }

    #[test]
    fn sampling_follows_the_overview_being_watched() {
        let history = History::default();
        assert!(!history.watched(1_000_000), "never viewed");
        history.viewed(1_000_000);
        assert!(history.watched(1_000_000));
        assert!(history.watched(1_000_000 + 15 * 60_000));
        assert!(!history.watched(1_000_000 + 15 * 60_000 + 1));
    }

    #[test]
    fn a_gap_splits_a_line_and_the_scale_tops_at_the_largest_figure() {
        let samples = [
            sample(0, Some(0), Some(10)),
            sample(10_000, Some(5), None),
            sample(20_000, Some(2_500), Some(4)),
            sample(30_000, Some(7), Some(3)),
        ];
        let svg = chart(&samples);
        assert_eq!(svg.matches("chart-backlog-line").count(), 1, "{svg}");
        // 10 then a gap then 4, 3: only the second run has two points.
        assert_eq!(svg.matches("chart-lag-line").count(), 1, "{svg}");
        assert!(svg.contains(">2,500<"), "{svg}");
        assert!(svg.contains("data-testid=\"chart-backlog\">7<"), "{svg}");
        assert!(chart(&samples[..1]).contains("chart-empty"));
    }
}
