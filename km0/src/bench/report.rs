//! What a bench reports: named measurements, each with every run and their median, and the
//! target it is held to; rendered as a compact table or as JSON.

use std::fmt::Write as _;

use serde::Serialize;

/// The result of one `km0 bench ...`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// `relay`, `consume` or `e2e`.
    pub bench: String,
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// What was measured, in words (sizes, rates, batch).
    pub setup: String,
    /// The settings, for machines.
    pub settings: serde_json::Value,
    /// The measurements, in display order.
    pub rows: Vec<Measurement>,
}

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// What it is, e.g. `relay x3 (entrega)`.
    pub name: String,
    /// Unit of the values, e.g. `events/s`, `ms`, `%`.
    pub unit: String,
    /// Every run's value, in run order.
    pub runs: Vec<f64>,
    /// The median of `runs`.
    pub median: f64,
    /// The target, e.g. `>= 70`, if the figure has one.
    pub target: Option<Target>,
}

/// A bound a figure must respect.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Target {
    /// `true`: the median must be at least `bound`; `false`: at most.
    pub at_least: bool,
    /// The bound, in the measurement's unit.
    pub bound: f64,
    /// Whether the median respects it.
    pub met: bool,
}

impl Target {
    /// The median must be at least `bound`.
    pub fn at_least(bound: f64, median: f64) -> Self {
        Self {
            at_least: true,
            bound,
            met: median >= bound,
        }
    }

    /// The median must be at most `bound`.
    pub fn at_most(bound: f64, median: f64) -> Self {
        Self {
            at_least: false,
            bound,
            met: median <= bound,
        }
    }
}

impl Measurement {
    /// A figure from its runs (the median is computed here).
    pub fn new(name: impl Into<String>, unit: impl Into<String>, runs: Vec<f64>) -> Self {
        let median = median(&runs);
        Self {
            name: name.into(),
            unit: unit.into(),
            runs,
            median,
            target: None,
        }
    }

    /// The same figure held to a target on its median.
    pub fn with_target(mut self, target: impl FnOnce(f64) -> Target) -> Self {
        self.target = Some(target(self.median));
        self
    }
}

/// Median of `values` (mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn number(value: f64, unit: &str) -> String {
    if unit == "ms" {
        return format!("{value:.2}");
    }
    if value.abs() < 100.0 && value.fract() != 0.0 {
        return format!("{value:.1}");
    }
    // Thousands separators: throughput figures are read at a glance.
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if value < 0.0 {
        out.insert(0, '-');
    }
    out
}

impl BenchReport {
    /// Whether every figure with a target meets it.
    pub fn targets_met(&self) -> bool {
        self.rows.iter().all(|r| r.target.is_none_or(|t| t.met))
    }

    /// The table printed by `km0 bench`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let runs = self.rows.first().map_or(0, |r| r.runs.len());
        let _ = writeln!(
            out,
            "km0 bench {} on {}: {} ({} run{}, median)",
            self.bench,
            self.backend,
            self.setup,
            runs,
            if runs == 1 { "" } else { "s" }
        );
        let name_width = self
            .rows
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(11);
        let _ = writeln!(
            out,
            "  {:<name_width$}  {:>12}  {:<9}  {:<16}  runs",
            "measurement", "median", "unit", "target"
        );
        for row in &self.rows {
            let target = row.target.map_or(String::new(), |t| {
                format!(
                    "{} {} {}",
                    if t.at_least { ">=" } else { "<=" },
                    number(t.bound, &row.unit),
                    if t.met { "ok" } else { "MISSED" }
                )
            });
            let runs: Vec<String> = row.runs.iter().map(|v| number(*v, &row.unit)).collect();
            let _ = writeln!(
                out,
                "  {:<name_width$}  {:>12}  {:<9}  {:<16}  {}",
                row.name,
                number(row.median, &row.unit),
                row.unit,
                target,
                runs.join(" ")
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn numbers_get_separators_and_latencies_decimals() {
        assert_eq!(number(1_234_567.0, "events/s"), "1,234,567");
        assert_eq!(number(999.0, "msgs/s"), "999");
        assert_eq!(number(12.345, "ms"), "12.35");
        assert_eq!(number(83.3, "%"), "83.3");
    }

    #[test]
    fn targets_decide_on_the_median() {
        let row = Measurement::new("x", "ms", vec![10.0, 30.0, 20.0])
            .with_target(|m| Target::at_most(25.0, m));
        assert!(row.target.is_some_and(|t| t.met));
        let row = Measurement::new("y", "%", vec![60.0]).with_target(|m| Target::at_least(70.0, m));
        assert!(row.target.is_some_and(|t| !t.met));
    }
}
