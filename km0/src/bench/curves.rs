//! `km0 bench curve`: how cost grows with load. Runs one bench over a range of one setting
//! (batch size, instances, arrival rate), writes the points as CSV and draws them as SVG.
//!
//! Each curve writes `<out>/<curve>-<setup>.csv` (setup: `sqlite`, `postgres`,
//! `postgres-kafka`, ...) and then redraws `<out>/<curve>.svg` from every
//! `<curve>-*.csv` there, so running a curve on the log transport and on Kafka gives one chart
//! with both. Every point also records who used the CPUs meanwhile (the machine, PostgreSQL,
//! the Kafka JVM, km0), which says what saturates first.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde_json::json;

use super::consume::{self, ConsumeArgs};
use super::cpu::{CpuSampler, CpuUse};
use super::e2e::{self, E2eArgs};
use super::plot::{self, Chart, Series};
use super::relay::{self, RelayArgs};
use super::report::{BenchReport, Measurement};
use super::{progress, Common};

/// The curves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Curve {
    /// Consumer msgs/s by records per poll, set-based and per event.
    ConsumeBatch,
    /// Consumer msgs/s by inventario instances (members of the group) in one process.
    ConsumeInstances,
    /// Relay events/s by relay instances.
    RelayInstances,
    /// End-to-end latency p50/p99 by arrival rate, until it breaks.
    E2eRate,
}

impl Curve {
    fn name(self) -> &'static str {
        match self {
            Self::ConsumeBatch => "consume-batch",
            Self::ConsumeInstances => "consume-instances",
            Self::RelayInstances => "relay-instances",
            Self::E2eRate => "e2e-rate",
        }
    }

    fn default_values(self) -> Vec<u32> {
        match self {
            Self::ConsumeBatch => vec![10, 25, 50, 100, 200, 500, 1000],
            Self::ConsumeInstances => vec![1, 2, 3],
            Self::RelayInstances => vec![1, 2, 3, 4],
            Self::E2eRate => vec![
                100, 200, 500, 1000, 1250, 1500, 1750, 2000, 3000, 4000, 6000,
            ],
        }
    }

    /// The x column, the columns drawn, and how the chart reads.
    fn layout(self) -> (&'static str, &'static [&'static str], Chart) {
        let chart = |title: &str, x: &str, y: &str, log_x: bool, log_y: bool| Chart {
            title: title.to_owned(),
            x_label: x.to_owned(),
            y_label: y.to_owned(),
            log_x,
            log_y,
            series: Vec::new(),
        };
        match self {
            Self::ConsumeBatch => (
                "batch",
                &["set_based_msgs_s", "per_event_msgs_s"],
                chart(
                    "inventario consumer: throughput by batch size",
                    "records per poll",
                    "msgs/s",
                    true,
                    false,
                ),
            ),
            Self::ConsumeInstances => (
                "instances",
                &["msgs_s"],
                chart(
                    "inventario consumer: throughput by instances",
                    "instances (6 partitions)",
                    "msgs/s",
                    false,
                    false,
                ),
            ),
            Self::RelayInstances => (
                "relays",
                &["events_s"],
                chart(
                    "relay: throughput by instances",
                    "relay instances",
                    "events/s",
                    false,
                    false,
                ),
            ),
            Self::E2eRate => (
                "rate",
                &["p50_ms", "p99_ms"],
                chart(
                    "end to end: latency by arrival rate",
                    "orders/s offered",
                    "ms (commit to consume)",
                    true,
                    true,
                ),
            ),
        }
    }
}

/// `km0 bench curve`.
#[derive(Debug, Clone, Args)]
pub struct CurveArgs {
    /// Which curve.
    #[arg(value_enum)]
    pub curve: Curve,
    /// The setting's values, comma separated (default: the curve's own range).
    #[arg(long, value_delimiter = ',')]
    pub values: Vec<u32>,
    /// Directory the CSV and the SVG are written to.
    #[arg(long, default_value = "docs/img")]
    pub out: PathBuf,
    /// Messages (consume curves) or outbox events (relay curve) per point.
    #[arg(long, default_value_t = 50_000)]
    pub messages: usize,
    /// Seconds of measured arrivals per point (e2e-rate).
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// e2e-rate stops after the first rate whose p99 exceeds this many milliseconds, or whose
    /// achieved arrival rate falls under 90% of the offered one.
    #[arg(long, default_value_t = 1000.0)]
    pub break_p99_ms: f64,
}

/// The points measured: one row per value, the x first.
#[derive(Debug, Default)]
struct Table {
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
}

impl Table {
    fn csv(&self) -> String {
        let mut out = self.columns.join(",");
        out.push('\n');
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .map(|v| {
                    if v.is_finite() {
                        format!("{v:.2}")
                    } else {
                        String::new()
                    }
                })
                .collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let columns: Vec<String> = lines
            .next()
            .context("an empty CSV")?
            .split(',')
            .map(str::to_owned)
            .collect();
        let rows = lines
            .map(|line| {
                line.split(',')
                    .map(|cell| {
                        if cell.is_empty() {
                            Ok(f64::NAN)
                        } else {
                            cell.parse::<f64>()
                        }
                    })
                    .collect::<Result<Vec<f64>, _>>()
                    .with_context(|| format!("a CSV row: {line}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { columns, rows })
    }

    fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

/// The CPU columns every curve records.
const CPU_COLUMNS: [&str; 5] = [
    "cpu_machine_pct",
    "cpu_postgres_pct",
    "cpu_kafka_pct",
    "cpu_km0_pct",
    "cpus",
];

fn cpu_cells(used: &CpuUse) -> [f64; 5] {
    [
        used.machine,
        used.of("postgres"),
        used.of("java"),
        used.of("km0"),
        used.cpus as f64,
    ]
}

/// Runs the curve, writes its CSV and redraws its chart; the report lists every point.
pub(crate) async fn run(common: &Common, args: &CurveArgs) -> anyhow::Result<BenchReport> {
    let values = if args.values.is_empty() {
        args.curve.default_values()
    } else {
        args.values.clone()
    };
    // Curves compare the engine with itself; the ceilings have their own benches.
    let common = Common {
        pgbench: None,
        recvlogical: None,
        ..common.clone()
    };
    let (x, _, _) = args.curve.layout();
    let mut table = Table {
        columns: std::iter::once(x.to_owned())
            .chain(value_columns(args.curve).iter().map(|c| (*c).to_owned()))
            .chain(CPU_COLUMNS.iter().map(|c| (*c).to_owned()))
            .collect(),
        rows: Vec::new(),
    };
    for value in values {
        progress(format!("{} at {value}", args.curve.name()));
        let sampler = CpuSampler::start();
        let measured = point(&common, args, value).await;
        let used = sampler.stop().await;
        let (cells, stop) = measured?;
        let mut row = vec![f64::from(value)];
        row.extend(cells);
        row.extend(cpu_cells(&used));
        table.rows.push(row);
        if stop {
            progress(format!("{} broke at {value}: stopping", args.curve.name()));
            break;
        }
    }
    let setup = common.place.backend().replace(" + ", "-");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let csv = args.out.join(format!("{}-{setup}.csv", args.curve.name()));
    std::fs::write(&csv, table.csv()).with_context(|| format!("writing {}", csv.display()))?;
    let svg = draw(args.curve, &args.out)?;
    progress(format!("wrote {} and {}", csv.display(), svg.display()));
    Ok(report(&common, args, &table))
}

/// The measured columns of a curve, in the CSV's order (after the x).
fn value_columns(curve: Curve) -> &'static [&'static str] {
    match curve {
        Curve::ConsumeBatch => &["set_based_msgs_s", "per_event_msgs_s"],
        Curve::ConsumeInstances => &["msgs_s"],
        Curve::RelayInstances => &["events_s"],
        Curve::E2eRate => &["p50_ms", "p99_ms", "achieved_per_s"],
    }
}

/// One point: its measured cells, and whether the curve stops here.
async fn point(common: &Common, args: &CurveArgs, value: u32) -> anyhow::Result<(Vec<f64>, bool)> {
    let n = usize::try_from(value)?;
    let median = |report: &BenchReport, prefix: &str| -> f64 {
        report
            .rows
            .iter()
            .find(|m| m.name.starts_with(prefix))
            .map_or(f64::NAN, |m: &Measurement| m.median)
    };
    let consume = |batch: usize, workers: usize, per_event: bool| ConsumeArgs {
        messages: args.messages,
        aggregates: args.messages,
        batch,
        workers,
        per_event,
        timeout: 600,
    };
    Ok(match args.curve {
        Curve::ConsumeBatch => {
            let set = consume::run(common, &consume(n, 1, false)).await?;
            let each = consume::run(common, &consume(n, 1, true)).await?;
            (
                vec![median(&set, "consume x1"), median(&each, "consume x1")],
                false,
            )
        }
        Curve::ConsumeInstances => {
            let report = consume::run(common, &consume(100, n, false)).await?;
            (vec![median(&report, &format!("consume x{n}"))], false)
        }
        Curve::RelayInstances => {
            let relay_args = RelayArgs {
                events: args.messages,
                aggregates: 10_000,
                relays: vec![n],
                batch: 100,
                timeout: 600,
                ..RelayArgs::polling()
            };
            let report = relay::run(common, &relay_args).await?;
            (
                vec![median(&report, &format!("relay x{n} (entrega)"))],
                false,
            )
        }
        Curve::E2eRate => {
            let e2e_args = E2eArgs {
                rate: value,
                duration: args.duration,
                warmup: 500,
                drain_timeout: 60,
            };
            match e2e::run(common, &e2e_args).await {
                Ok(report) => {
                    let p99 = median(&report, "latency p99");
                    let achieved = median(&report, "arrival rate achieved");
                    let broke = p99 > args.break_p99_ms || achieved < 0.9 * f64::from(value);
                    (vec![median(&report, "latency p50"), p99, achieved], broke)
                }
                // The events did not all arrive within the drain timeout: broken.
                Err(e) => {
                    progress(format!("e2e at {value}/s failed: {e:#}"));
                    (vec![f64::NAN, f64::NAN, f64::NAN], true)
                }
            }
        }
    })
}

/// Redraws `<out>/<curve>.svg` from every `<curve>-*.csv` in `out`; returns its path.
fn draw(curve: Curve, out: &Path) -> anyhow::Result<PathBuf> {
    let (x, drawn, mut chart) = curve.layout();
    let prefix = format!("{}-", curve.name());
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "csv")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    files.sort();
    for file in files {
        let setup = file
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix(&prefix))
            .unwrap_or("?")
            .to_owned();
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let table = Table::parse(&text).with_context(|| format!("reading {}", file.display()))?;
        let Some(xi) = table.column(x) else { continue };
        for column in drawn {
            let Some(yi) = table.column(column) else {
                continue;
            };
            let points = table
                .rows
                .iter()
                .filter_map(|r| Some((*r.get(xi)?, *r.get(yi)?)))
                .filter(|(_, y)| y.is_finite())
                .collect();
            let what = column.trim_end_matches("_msgs_s").trim_end_matches("_ms");
            let name = if drawn.len() == 1 {
                setup.clone()
            } else {
                format!("{setup} {what}")
            };
            chart.series.push(Series { name, points });
        }
    }
    let path = out.join(format!("{}.svg", curve.name()));
    std::fs::write(&path, plot::svg(&chart))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn report(common: &Common, args: &CurveArgs, table: &Table) -> BenchReport {
    let mut rows = Vec::new();
    for row in &table.rows {
        for (i, column) in table.columns.iter().enumerate().skip(1) {
            if column == "cpus" {
                continue;
            }
            let unit = if column.ends_with("_pct") {
                "%"
            } else if column.ends_with("_ms") {
                "ms"
            } else {
                "/s"
            };
            let value = row.get(i).copied().unwrap_or(f64::NAN);
            rows.push(Measurement::new(
                format!("{} {} {column}", table.columns[0], row[0]),
                unit,
                vec![value],
            ));
        }
    }
    BenchReport {
        bench: format!("curve {}", args.curve.name()),
        backend: common.place.backend().to_owned(),
        setup: format!(
            "{} points, written to {}",
            table.rows.len(),
            args.out.display()
        ),
        settings: json!({
            "curve": args.curve.name(),
            "messages": args.messages,
            "duration_s": args.duration,
        }),
        rows,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_back_what_it_wrote_with_gaps_as_nan() {
        let table = Table {
            columns: vec!["rate".into(), "p50_ms".into(), "p99_ms".into()],
            rows: vec![vec![100.0, 3.5, 9.25], vec![200.0, f64::NAN, 12.0]],
        };
        let text = table.csv();
        assert_eq!(
            text,
            "rate,p50_ms,p99_ms\n100.00,3.50,9.25\n200.00,,12.00\n"
        );
        let back = Table::parse(&text).unwrap();
        assert_eq!(back.columns, table.columns);
        assert!(back.rows[1][1].is_nan());
        assert_eq!(back.rows[1][2], 12.0);
    }

    #[test]
    fn the_chart_gathers_every_setup_of_a_curve() {
        let dir = std::env::temp_dir().join(format!("km0-curve-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("e2e-rate-postgres.csv"),
            "rate,p50_ms,p99_ms\n100,2,5\n200,3,8\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("e2e-rate-postgres-kafka.csv"),
            "rate,p50_ms,p99_ms\n100,4,9\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("relay-instances-postgres.csv"),
            "relays,events_s\n1,5\n",
        )
        .unwrap();
        let svg = std::fs::read_to_string(draw(Curve::E2eRate, &dir).unwrap()).unwrap();
        assert_eq!(
            svg.matches("<polyline").count(),
            4,
            "p50 and p99 of two setups"
        );
        assert!(svg.contains(">postgres-kafka p99</text>") && svg.contains(">postgres p50</text>"));
        assert_eq!(svg.matches("<circle").count(), 6);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
