//! `km0 bench saga`: the whole order saga as a user runs it. pedidos (orchestrating), inventario
//! (the reservation), pagos (the charge, through the gateway simulator with no injected
//! faults) and reparto (the courier) run as `km0 run` processes of their own, each with its
//! relay, on the run's databases and broker; the bench posts orders over HTTP.
//!
//! A run first finds the saturation: HTTP clients post orders as fast as they are answered,
//! and the sagas completed per second while they do are the saturation. Then it places orders
//! at fixed rates (percentages of that saturation, and fixed sagas per second) and reports each
//! saga's duration, from the transaction that stored its order to the one that completed it,
//! as the saga's own row records them. Where the time goes comes from the sagas' history: each
//! step from its command written to its reply applied, and pedidos' turns between them; and
//! each process's CPU from `/proc`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use entrega::db::{query, Db};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cpu::{CpuSampler, CpuUse, Labels};
use super::fleet::Fleet;
use super::progress;
use super::report::{BenchReport, Measurement, Target};
use super::workload::{fill_stock, product};
use crate::services::pedidos::SAGA_KIND;
use crate::wiring::System;

/// Where every order goes: a city reparto serves.
const CITY: &str = "Madrid";
/// The services of the saga, each a process of its own, in the order they start: pedidos'
/// API and orchestrator, its outbox's relay, and the three services the steps go to (each
/// relays its own outbox).
const SERVICES: [&str; 5] = ["pedidos", "relay", "inventario", "pagos", "reparto"];
/// The target's rate and its p99 bound (PostgreSQL + Kafka).
const TARGET_RATE: u32 = 100;
const TARGET_P99_MS: f64 = 100.0;
/// Saturation is counted from this long after its orders start (the pipeline fills up).
const SATURATION_WARMUP: Duration = Duration::from_secs(3);
/// How long consumers on a broker server are given to join their groups.
const GROUP_SETTLE: Duration = Duration::from_secs(10);

/// `km0 bench saga`.
#[derive(Debug, Clone, Args)]
pub struct SagaArgs {
    /// Seconds the saturation is measured for.
    #[arg(long, default_value_t = 20)]
    pub saturation_seconds: u64,
    /// Sagas kept under way while the saturation is measured: a new order is posted as soon
    /// as one ends.
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// Fixed-rate phases, in percent of the saturation measured in the same run.
    #[arg(long, value_delimiter = ',', default_value = "50,80,100")]
    pub loads: Vec<u32>,
    /// More fixed-rate phases, in sagas per second.
    #[arg(long, value_delimiter = ',', default_value = "100")]
    pub rates: Vec<u32>,
    /// Seconds of each fixed-rate phase.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Couriers in the orders' city; each delivers in a second and is free again.
    #[arg(long, default_value_t = 3_000)]
    pub couriers: usize,
    /// Every service in one `km0 up` process (as the embedded default runs) instead of a
    /// process each. On SQLite, processes apart see each other's commits only by polling.
    #[arg(long)]
    pub together: bool,
    /// Longest wait for a phase's sagas to end, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

/// One phase's orders: their id prefix and how many were accepted.
struct Placed {
    prefix: String,
    accepted: u64,
    refused: u64,
}

/// What one phase measured.
struct Phase {
    /// Sagas per second asked for (0 for the saturation).
    rate: f64,
    durations: Histogram<u64>,
    /// Sagas that ended otherwise than completed (compensated, needing an operator).
    not_completed: u64,
    /// Mean ms of each segment of a completed saga, in [`SEGMENTS`] order.
    segments: Vec<f64>,
    cpu: CpuUse,
}

/// One run: the saturation, then each fixed-rate phase.
struct RunResult {
    saturation: f64,
    accepted_per_s: f64,
    saturation_cpu: CpuUse,
    phases: Vec<(String, Phase)>,
}

/// Runs the bench `runs` times on fresh deployments made from `base`.
pub(crate) async fn run(
    base: &System,
    backend: &str,
    runs: usize,
    keep: bool,
    args: &SagaArgs,
) -> anyhow::Result<BenchReport> {
    let mut results = Vec::with_capacity(runs);
    for round in 1..=runs {
        progress(format!("saga, run {round}/{runs}"));
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let system = base
            .fresh(&format!("saga{id}"))
            .context("a fresh deployment")?;
        let result = one_run(&system, &id, args).await;
        if keep {
            eprintln!("kept: {}", system.describe());
        } else if let Err(e) = system.destroy().await {
            progress(format!("could not remove the run's databases: {e}"));
        }
        let result = result?;
        progress(format!(
            "saturation {:.0} sagas/s; {}",
            result.saturation,
            result
                .phases
                .iter()
                .map(|(name, p)| format!(
                    "{name}: p50 {:.1} ms, p99 {:.1} ms",
                    ms(p.durations.value_at_quantile(0.5)),
                    ms(p.durations.value_at_quantile(0.99))
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ));
        results.push(result);
    }
    Ok(report(backend, args, &results))
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

async fn one_run(system: &System, id: &str, args: &SagaArgs) -> anyhow::Result<RunResult> {
    prepare(system, args.couriers).await?;
    let labels = Labels::default();
    let mut fleet = Fleet::new(system, labels.clone())?
        .with_saga(&["--delivery-time-s".to_owned(), "1".to_owned()]);
    let result = async {
        let pedidos = if args.together {
            fleet.start_up(TOGETHER).await?
        } else {
            apart(&mut fleet).await?
        };
        let pedidos = pedidos.context("pedidos named no HTTP address")?;
        if system.broker_kind()?.is_server() {
            tokio::time::sleep(GROUP_SETTLE).await;
        }
        let watch = system.pedidos().await.context("opening pedidos")?;
        let db = watch.db().clone();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(args.in_flight.max(64))
            .build()?;
        let target = Orders {
            http,
            url: format!("http://{pedidos}/pedidos"),
        };
        let limit = Duration::from_secs(args.timeout);

        // Warm-up: connections, caches, the first polls; not measured.
        let warm = target.at_rate(&format!("W{id}-"), 20.0, 5).await;
        ended(&db, &warm.prefix, warm.accepted, limit, &mut fleet).await?;
        let (_, failed) = durations(&db, &warm.prefix).await?;
        if warm.accepted == 0 || failed > 0 {
            bail!(
                "of {} warm-up orders, {failed} sagas did not complete; the processes' logs: {}",
                warm.accepted,
                fleet.logs().display()
            );
        }

        let sampler = CpuSampler::start_labelled(labels.clone());
        let (placed, window) = target
            .saturate(
                &db,
                &format!("S{id}-"),
                args.in_flight,
                args.saturation_seconds,
            )
            .await?;
        let saturation_cpu = sampler.stop().await;
        ended(&db, &placed.prefix, placed.accepted, limit, &mut fleet).await?;
        let saturation = completed_within(&db, &placed.prefix, window).await?;
        let accepted_per_s = placed.accepted as f64 / args.saturation_seconds.max(1) as f64;
        if placed.refused > 0 {
            progress(format!("{} orders not answered 201", placed.refused));
        }

        let mut phases = Vec::new();
        let plan = args
            .loads
            .iter()
            .map(|l| (format!("{l}%"), saturation * f64::from(*l) / 100.0))
            .chain(args.rates.iter().map(|r| (format!("{r}/s"), f64::from(*r))));
        for (n, (name, rate)) in plan.enumerate() {
            let rate = rate.max(1.0);
            let sampler = CpuSampler::start_labelled(labels.clone());
            let placed = target
                .at_rate(&format!("F{id}-{n}-"), rate, args.seconds)
                .await;
            ended(&db, &placed.prefix, placed.accepted, limit, &mut fleet).await?;
            let cpu = sampler.stop().await;
            let (durations, not_completed) = durations(&db, &placed.prefix).await?;
            let segments = segments(&db, &placed.prefix).await?;
            phases.push((
                name,
                Phase {
                    rate,
                    durations,
                    not_completed,
                    segments,
                    cpu,
                },
            ));
        }
        db.close().await;
        Ok(RunResult {
            saturation,
            accepted_per_s,
            saturation_cpu,
            phases,
        })
    }
    .await;
    fleet.stop().await;
    result
}

/// The name `km0 up` runs under, and its CPU is counted as (not `km0...`: that prefix is the
/// bench's own process).
const TOGETHER: &str = "up";

/// The gateway simulator, then each of [`SERVICES`] as a process; pedidos' address.
async fn apart(fleet: &mut Fleet) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let gateway = fleet
        .start_with("pasarela", "pasarela-1", &[])
        .await?
        .context("the gateway simulator named no HTTP address")?;
    let mut pedidos = None;
    for service in SERVICES {
        let extra = if service == "pagos" {
            vec!["--pasarela-url".to_owned(), format!("http://{gateway}")]
        } else {
            Vec::new()
        };
        let addr = fleet
            .start_with(service, &format!("{service}-1"), &extra)
            .await?;
        if service == "pedidos" {
            pedidos = addr;
        }
    }
    Ok(pedidos)
}

/// Stock enough for every order and couriers in the orders' city, before the processes start.
async fn prepare(system: &System, couriers: usize) -> anyhow::Result<()> {
    let stock = system.inventario().await.context("opening inventario")?;
    fill_stock(&stock).await?;
    stock.db().close().await;
    let reparto = system.reparto().await.context("opening reparto")?;
    let ids: Vec<String> = (0..couriers).map(|i| format!("R-BENCH-{i}")).collect();
    for chunk in ids.chunks(500) {
        let values: Vec<String> = chunk
            .iter()
            .map(|id| format!("('{id}', '{CITY}')"))
            .collect();
        reparto
            .db()
            .execute(query(format!(
                "INSERT INTO repartidores (id, ciudad) VALUES {} ON CONFLICT (id) DO NOTHING",
                values.join(", ")
            )))
            .await?;
    }
    reparto.db().close().await;
    Ok(())
}

/// Where and how orders are posted.
struct Orders {
    http: reqwest::Client,
    url: String,
}

impl Orders {
    /// Order `id`: two lines of one unit, a card the gateway accepts, an address in [`CITY`].
    fn body(id: &str, n: usize) -> Value {
        json!({
            "id": id,
            "cliente": "bench",
            "mercado": "girona",
            "tarjeta": "tok_visa",
            "direccion_entrega": {"ciudad": CITY, "codigo_postal": "28013", "calle": "Gran Via 1"},
            "lineas": [
                {"producto": product(n), "cantidad": 1, "precio_centimos": 350},
                {"producto": product(n + 1), "cantidad": 1, "precio_centimos": 350},
            ],
        })
    }

    /// Whether posting order `n` under `prefix` was answered 201.
    async fn post(&self, prefix: &str, n: usize) -> bool {
        let body = Self::body(&format!("{prefix}{n}"), n);
        matches!(
            self.http.post(&self.url).json(&body).send().await,
            Ok(r) if r.status().as_u16() == 201
        )
    }

    /// Orders at `rate` per second for `seconds`, each posted at its scheduled time by a task
    /// of its own (a slow answer does not delay the next arrival).
    async fn at_rate(&self, prefix: &str, rate: f64, seconds: u64) -> Placed {
        let total = (rate * seconds as f64).round().max(1.0) as usize;
        let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let start = Instant::now();
        let mut posts = JoinSet::new();
        for n in 0..total {
            tokio::time::sleep_until(start + interval.mul_f64(n as f64)).await;
            let (http, url, prefix) = (self.http.clone(), self.url.clone(), prefix.to_owned());
            posts.spawn(async move { Orders { http, url }.post(&prefix, n).await });
        }
        let (mut accepted, mut refused) = (0, 0);
        while let Some(done) = posts.join_next().await {
            if matches!(done, Ok(true)) {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        Placed {
            prefix: prefix.to_owned(),
            accepted,
            refused,
        }
    }

    /// Orders for `seconds`, keeping `in_flight` sagas under way: a new order is posted as soon
    /// as one ends (or is refused). The saturation is the sagas completed per second within the
    /// returned window (epoch ms), which leaves out the first seconds.
    async fn saturate(
        &self,
        db: &Db,
        prefix: &str,
        in_flight: usize,
        seconds: u64,
    ) -> anyhow::Result<(Placed, (i64, i64))> {
        let started_ms = entrega_core::now_ms();
        let until = Instant::now() + Duration::from_secs(seconds);
        let slots = Arc::new(Semaphore::new(in_flight.max(1)));
        let accepted = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let mut posts = JoinSet::new();
        let mut seen = 0u64;
        let mut n = 0usize;
        while Instant::now() < until {
            // Sagas that ended since the last look free their slots.
            let done = u64::try_from(ended_count(db, prefix).await?).unwrap_or(0);
            if done > seen {
                slots.add_permits(usize::try_from(done - seen).unwrap_or(0));
                seen = done;
            }
            while let Ok(slot) = Arc::clone(&slots).try_acquire_owned() {
                slot.forget();
                let (http, url, prefix) = (self.http.clone(), self.url.clone(), prefix.to_owned());
                let (accepted, refused, slots) = (
                    Arc::clone(&accepted),
                    Arc::clone(&refused),
                    Arc::clone(&slots),
                );
                posts.spawn(async move {
                    if (Orders { http, url }).post(&prefix, n).await {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                        slots.add_permits(1);
                    }
                });
                n += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while posts.join_next().await.is_some() {}
        let ended_ms = entrega_core::now_ms();
        let window_start = started_ms + i64::try_from(SATURATION_WARMUP.as_millis()).unwrap_or(0);
        Ok((
            Placed {
                prefix: prefix.to_owned(),
                accepted: accepted.load(Ordering::Relaxed),
                refused: refused.load(Ordering::Relaxed),
            },
            (window_start.min(ended_ms - 1), ended_ms),
        ))
    }
}

/// Sagas under `prefix` that have ended, however.
async fn ended_count(db: &Db, prefix: &str) -> anyhow::Result<i64> {
    Ok(db
        .scalar(
            query(
                "SELECT COUNT(*) FROM entrega_sagas WHERE kind = $1 AND saga_id LIKE $2 \
                 AND state IN ('completed', 'compensated', 'needs_operator')",
            )
            .bind(SAGA_KIND)
            .bind(format!("{prefix}%")),
        )
        .await?
        .unwrap_or(0))
}

/// Waits until `expected` sagas under `prefix` have ended, failing when a process stopped or
/// `limit` passed.
async fn ended(
    db: &Db,
    prefix: &str,
    expected: u64,
    limit: Duration,
    fleet: &mut Fleet,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let done = ended_count(db, prefix).await?;
        if u64::try_from(done).unwrap_or(0) >= expected {
            return Ok(());
        }
        if !fleet.all_running() {
            bail!("a process of the saga stopped");
        }
        if Instant::now() >= deadline {
            bail!("{done} of {expected} sagas ({prefix}*) ended within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sagas under `prefix` completed per second within `window` (epoch ms).
async fn completed_within(db: &Db, prefix: &str, (from, to): (i64, i64)) -> anyhow::Result<f64> {
    let n: i64 = db
        .scalar(
            query(
                "SELECT COUNT(*) FROM entrega_sagas WHERE kind = $1 AND saga_id LIKE $2 \
                 AND state = 'completed' AND updated_at_ms >= $3 AND updated_at_ms < $4",
            )
            .bind(SAGA_KIND)
            .bind(format!("{prefix}%"))
            .bind(from)
            .bind(to),
        )
        .await?
        .unwrap_or(0);
    Ok(n as f64 * 1000.0 / (to - from).max(1) as f64)
}

/// The durations of the completed sagas under `prefix` (µs), and how many ended otherwise.
async fn durations(db: &Db, prefix: &str) -> anyhow::Result<(Histogram<u64>, u64)> {
    let rows: Vec<(String, i64, i64)> = db
        .fetch_all(
            query(
                "SELECT state, created_at_ms, updated_at_ms FROM entrega_sagas \
                 WHERE kind = $1 AND saga_id LIKE $2",
            )
            .bind(SAGA_KIND)
            .bind(format!("{prefix}%")),
        )
        .await?;
    let mut histogram = Histogram::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut not_completed = 0;
    for (state, created, updated) in rows {
        if state == "completed" {
            histogram.record(u64::try_from((updated - created).max(0) * 1000)?.max(1))?;
        } else {
            not_completed += 1;
        }
    }
    Ok((histogram, not_completed))
}

/// A completed saga's segments, from its history: pedidos' turn before each step's command,
/// each step from its command written to its reply applied, and the turn after the last.
const SEGMENTS: [&str; 7] = [
    "pedidos, order stored to the reservation's command",
    "reserva (inventario), command to reply",
    "pedidos, to the charge's command",
    "cobro (pagos and the gateway), command to reply",
    "pedidos, to the courier's command",
    "reparto, command to reply",
    "pedidos, last reply to completed",
];

/// The mean of each of [`SEGMENTS`] over the completed sagas under `prefix`, in ms.
async fn segments(db: &Db, prefix: &str) -> anyhow::Result<Vec<f64>> {
    let rows: Vec<(String, i64, String, String)> = db
        .fetch_all(
            query(
                "SELECT saga_id, at_ms, what, step FROM entrega_saga_history \
                 WHERE kind = $1 AND saga_id LIKE $2 ORDER BY saga_id, n",
            )
            .bind(SAGA_KIND)
            .bind(format!("{prefix}%")),
        )
        .await?;
    let mut sums = [0.0f64; SEGMENTS.len()];
    let mut sagas = 0u64;
    let mut i = 0;
    while i < rows.len() {
        let saga = &rows[i].0;
        let end = rows[i..]
            .iter()
            .position(|r| &r.0 != saga)
            .map_or(rows.len(), |p| i + p);
        if let Some(points) = saga_points(&rows[i..end]) {
            for (k, pair) in points.windows(2).enumerate() {
                sums[k] += (pair[1] - pair[0]) as f64;
            }
            sagas += 1;
        }
        i = end;
    }
    Ok(sums
        .iter()
        .map(|s| if sagas == 0 { 0.0 } else { s / sagas as f64 })
        .collect())
}

/// The eight instants bounding a completed saga's segments, or `None` for a saga that did not
/// go straight through (a step sent again, compensated).
fn saga_points(history: &[(String, i64, String, String)]) -> Option<[i64; 8]> {
    let at = |what: &str, step: &str| {
        history
            .iter()
            .find(|(_, _, w, s)| w == what && s == step)
            .map(|(_, at, _, _)| *at)
    };
    Some([
        at("started", "")?,
        at("sent", "reserva")?,
        at("replied", "reserva")?,
        at("sent", "cobro")?,
        at("replied", "cobro")?,
        at("sent", "reparto")?,
        at("replied", "reparto")?,
        at("completed", "")?,
    ])
}

fn report(backend: &str, args: &SagaArgs, results: &[RunResult]) -> BenchReport {
    let series = |f: &dyn Fn(&RunResult) -> f64| results.iter().map(f).collect::<Vec<f64>>();
    let mut rows = vec![
        Measurement::new(
            "saturation, sagas completed",
            "sagas/s",
            series(&|r| r.saturation),
        ),
        Measurement::new(
            "saturation, orders accepted",
            "orders/s",
            series(&|r| r.accepted_per_s),
        ),
    ];
    let cpus: Vec<CpuUse> = results.iter().map(|r| r.saturation_cpu.clone()).collect();
    rows.extend(cpu_rows("at saturation", &cpus));
    let names: Vec<String> = results
        .first()
        .map(|r| r.phases.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    for (k, name) in names.iter().enumerate() {
        fn phase(r: &RunResult, k: usize) -> Option<&Phase> {
            r.phases.get(k).map(|(_, p)| p)
        }
        let quantile = |q: f64| {
            series(&|r| phase(r, k).map_or(f64::NAN, |p| ms(p.durations.value_at_quantile(q))))
        };
        rows.push(Measurement::new(
            format!("at {name}: rate"),
            "sagas/s",
            series(&|r| phase(r, k).map_or(f64::NAN, |p| p.rate)),
        ));
        let p99 = Measurement::new(format!("at {name}: duration p99"), "ms", quantile(0.99));
        rows.push(Measurement::new(
            format!("at {name}: duration p50"),
            "ms",
            quantile(0.5),
        ));
        rows.push(
            if name == &format!("{TARGET_RATE}/s") && backend == "postgres + kafka" {
                p99.with_target(|m| Target::at_most(TARGET_P99_MS, m))
            } else {
                p99
            },
        );
        rows.push(Measurement::new(
            format!("at {name}: duration max"),
            "ms",
            series(&|r| phase(r, k).map_or(f64::NAN, |p| ms(p.durations.max()))),
        ));
        rows.push(Measurement::new(
            format!("at {name}: sagas not completed"),
            "sagas",
            series(&|r| phase(r, k).map_or(f64::NAN, |p| p.not_completed as f64)),
        ));
        for (s, segment) in SEGMENTS.iter().enumerate() {
            rows.push(Measurement::new(
                format!("at {name}: {segment}"),
                "ms",
                series(&|r| {
                    phase(r, k)
                        .and_then(|p| p.segments.get(s).copied())
                        .unwrap_or(f64::NAN)
                }),
            ));
        }
        let phase_cpu = |r: &RunResult| r.phases.get(k).map(|(_, p)| p.cpu.clone());
        let cpus: Vec<CpuUse> = results.iter().filter_map(phase_cpu).collect();
        rows.extend(cpu_rows(&format!("at {name}"), &cpus));
    }
    BenchReport {
        bench: "saga".to_owned(),
        backend: backend.to_owned(),
        setup: format!(
            "pedidos, its relay, inventario, pagos, reparto and the gateway simulator {}; {} \
             sagas under way for {} s (saturation), then {} s at each of {} of it and {} \
             sagas/s",
            if args.together {
                "in one km0 up"
            } else {
                "as km0 processes"
            },
            args.in_flight,
            args.saturation_seconds,
            args.seconds,
            args.loads
                .iter()
                .map(|l| format!("{l}%"))
                .collect::<Vec<_>>()
                .join(", "),
            args.rates
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        settings: json!({
            "saturation_seconds": args.saturation_seconds,
            "in_flight": args.in_flight,
            "together": args.together,
            "loads": args.loads,
            "rates": args.rates,
            "seconds": args.seconds,
            "couriers": args.couriers,
        }),
        rows,
    }
}

/// Each process's CPU, the database's and the broker's, and the machine's, over one phase.
fn cpu_rows(phase: &str, cpus: &[CpuUse]) -> Vec<Measurement> {
    let of = |label: &str| cpus.iter().map(|c| c.of(label)).collect::<Vec<f64>>();
    let mut labels: Vec<(&str, String)> = SERVICES
        .iter()
        .chain(&["pasarela"])
        .map(|s| (*s, format!("{s}-1")))
        .collect();
    labels.push(("km0 up", TOGETHER.to_owned()));
    labels.extend([
        ("PostgreSQL", "postgres".to_owned()),
        ("Kafka (Java)", "java".to_owned()),
        ("RabbitMQ", "beam.smp".to_owned()),
        ("the bench itself", "km0".to_owned()),
    ]);
    let mut rows: Vec<Measurement> = labels
        .iter()
        .map(|(name, label)| {
            Measurement::new(format!("{phase}: CPU of {name}"), "% of a CPU", of(label))
        })
        .filter(|m| m.median > 0.0)
        .collect();
    rows.push(Measurement::new(
        format!("{phase}: the machine"),
        "% of a CPU",
        cpus.iter().map(|c| c.machine).collect(),
    ));
    rows
}
