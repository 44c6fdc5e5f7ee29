//! Scaling with processes: each stage of the order flow run as 1, 2, 3 `km0 run` processes of
//! its own on a fresh deployment, as they are deployed, with the CPU each process used.
//!
//! - `relay`: once the relays share the outbox's lanes, a backlog is committed at once and
//!   they drain it; events/s from the first row marked published to the last, as the
//!   database stamped them.
//! - `inventario`: once the consumers formed their group, a backlog is put on the topic and
//!   they drain it; msgs/s from the first key recorded to the last.
//! - `pedidos`: HTTP clients post orders to the instances in turn for a while; orders/s
//!   answered `201`.
//!
//! The CPU of each process (and of PostgreSQL, Kafka, the bench itself) is read from `/proc`
//! over the stage's measured span, in percent of one CPU, so a reader sees what grows with the
//! instances and what does not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use serde_json::json;

use super::cpu::{CpuSampler, CpuUse, Labels};
use super::fleet::Fleet;
use super::report::{BenchReport, Measurement};
use super::workload::{fill_stock, outbox_events, prefill_topic, topic_messages};
use super::{progress, BenchRun, Common};
use crate::services::pedidos::TOPIC;
use crate::wiring::ensure_topic_and_dlq;
use crate::wiring::System;
use entrega::db::{query_each, Db};

/// `km0 bench scale`.
#[derive(Debug, Clone, Args)]
pub struct ScaleArgs {
    /// The stages to measure.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "relay,inventario,pedidos"
    )]
    pub stages: Vec<Stage>,
    /// How many processes of each stage, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub instances: Vec<usize>,
    /// Events prefilled for the relay and inventario stages.
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Orders (aggregates) the events are spread over.
    #[arg(long, default_value_t = 1_000)]
    pub aggregates: usize,
    /// Seconds the clients post orders to pedidos (after two of warm-up).
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// HTTP clients posting at once.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Longest wait for a drain, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// A stage of the order flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stage {
    /// `km0 run relay`.
    Relay,
    /// `km0 run inventario`.
    Inventario,
    /// `km0 run pedidos`.
    Pedidos,
}

impl Stage {
    fn component(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Inventario => "inventario",
            Self::Pedidos => "pedidos",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::Relay => "events/s",
            Self::Inventario => "msgs/s",
            Self::Pedidos => "orders/s",
        }
    }
}

/// How long the consumers are given to form their group before the backlog comes: a Kafka
/// group's joins and first assignment take a few seconds.
const GROUP_SETTLE: Duration = Duration::from_secs(10);

/// One measurement: the rate, and the CPU over its span.
struct Scaled {
    rate: f64,
    cpu: CpuUse,
}

pub(crate) async fn run(common: &Common, args: &ScaleArgs) -> anyhow::Result<BenchReport> {
    let mut rows = Vec::new();
    for stage in &args.stages {
        for &k in &args.instances {
            let k = k.max(1);
            let mut rates = Vec::with_capacity(common.runs);
            let mut cpus = Vec::with_capacity(common.runs);
            for round in 1..=common.runs {
                progress(format!(
                    "scale {} x{k}, run {round}/{}",
                    stage.component(),
                    common.runs
                ));
                let run = common.place.fresh();
                let system = scoped(common, &run);
                let result = measure(*stage, k, &system, args).await;
                if let Some(id) = namespace(common, &run) {
                    remove_namespace(&system, &id).await;
                }
                common.cleanup(&run).await?;
                let scaled = result?;
                progress(format!(
                    "scale {} x{k}: {:.0} {}",
                    stage.component(),
                    scaled.rate,
                    stage.unit()
                ));
                rates.push(scaled.rate);
                cpus.push(scaled.cpu);
            }
            rows.extend(rows_of(*stage, k, rates, &cpus, &common.place));
        }
    }
    Ok(BenchReport {
        bench: "scale".to_owned(),
        backend: common.place.backend().to_owned(),
        setup: format!(
            "each stage as 1 to {} km0 processes: relays draining {} events, inventario \
             draining {} messages (over {} orders), {} clients posting to pedidos for {} s",
            args.instances.iter().max().copied().unwrap_or(1),
            args.events,
            args.events,
            args.aggregates,
            args.clients,
            args.seconds
        ),
        settings: json!({
            "stages": args.stages.iter().map(|s| s.component()).collect::<Vec<_>>(),
            "instances": args.instances,
            "events": args.events,
            "aggregates": args.aggregates,
            "seconds": args.seconds,
            "clients": args.clients,
        }),
        rows,
    })
}

/// The rate, each instance's CPU, and what PostgreSQL and Kafka used, for `k` processes.
fn rows_of(
    stage: Stage,
    k: usize,
    rates: Vec<f64>,
    cpus: &[CpuUse],
    place: &super::BenchPlace,
) -> Vec<Measurement> {
    let name = stage.component();
    let mut rows = vec![Measurement::new(
        format!("{name} x{k}"),
        stage.unit(),
        rates,
    )];
    let of = |label: &str| cpus.iter().map(|c| c.of(label)).collect::<Vec<f64>>();
    for i in 1..=k {
        let label = format!("{name}-{i}");
        rows.push(Measurement::new(
            format!("{name} x{k}: CPU of {label}"),
            "% of a CPU",
            of(&label),
        ));
    }
    if place.postgres_server().is_some() {
        rows.push(Measurement::new(
            format!("{name} x{k}: CPU of PostgreSQL"),
            "% of a CPU",
            of("postgres"),
        ));
    }
    if place.on_kafka() {
        rows.push(Measurement::new(
            format!("{name} x{k}: CPU of Java (the Kafka brokers)"),
            "% of a CPU",
            of("java"),
        ));
    }
    // The bench's own process: the HTTP clients, for pedidos.
    rows.push(Measurement::new(
        format!("{name} x{k}: CPU of the bench itself"),
        "% of a CPU",
        of("km0"),
    ));
    rows.push(Measurement::new(
        format!("{name} x{k}: the machine"),
        "% of a CPU",
        cpus.iter().map(|c| c.machine).collect(),
    ));
    rows
}

/// The run's deployment as its processes see it: on Kafka, under a namespace of the run's
/// own (km0's topic and group names, kept apart from other runs').
fn scoped(common: &Common, run: &BenchRun) -> System {
    match namespace(common, run) {
        Some(id) => {
            let url = run.system.broker_url();
            let sep = if url.contains('?') { '&' } else { '?' };
            System::new(
                run.system.databases().clone(),
                format!("{url}{sep}namespace={id}."),
            )
        }
        None => run.system.clone(),
    }
}

/// The run's namespace on Kafka: its database prefix without the trailing `_`.
fn namespace(common: &Common, run: &BenchRun) -> Option<String> {
    common
        .place
        .on_kafka()
        .then(|| run.system.databases().prefix.clone())
        .flatten()
        .map(|p| p.trim_end_matches('_').to_owned())
}

async fn remove_namespace(system: &System, id: &str) {
    if let Ok(broker) = system.broker().await {
        if let Err(e) = broker
            .remove_namespace_within(Duration::from_secs(30))
            .await
        {
            progress(format!("could not remove the run's topics ({id}.*): {e}"));
        }
    }
}

async fn measure(
    stage: Stage,
    k: usize,
    system: &System,
    args: &ScaleArgs,
) -> anyhow::Result<Scaled> {
    let labels = Labels::default();
    let mut fleet = Fleet::new(system, labels.clone())?;
    let result = match stage {
        Stage::Relay => relays(k, system, &mut fleet, labels, args).await,
        Stage::Inventario => consumers(k, system, &mut fleet, labels, args).await,
        Stage::Pedidos => order_takers(k, &mut fleet, labels, args).await,
    };
    fleet.stop().await;
    result
}

async fn relays(
    k: usize,
    system: &System,
    fleet: &mut Fleet,
    labels: Labels,
    args: &ScaleArgs,
) -> anyhow::Result<Scaled> {
    let pedidos = system.pedidos().await.context("opening pedidos")?;
    let db = pedidos.db().clone();
    let events = outbox_events(args.events, args.aggregates)?;
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, TOPIC).await?;
    fleet.start_each("relay", k).await?;
    // Relays that run for long have shared the outbox's lanes out before a backlog comes:
    // the backlog is committed once every relay holds lanes, in one transaction, so it
    // appears all at once.
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    while count(
        &db,
        "SELECT COUNT(DISTINCT owner) FROM entrega_relay_lanes WHERE owner IS NOT NULL",
    )
    .await?
        < i64::try_from(k)?
    {
        if Instant::now() >= deadline || !fleet.all_running() {
            bail!("the {k} relays did not share the lanes out");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sampler = CpuSampler::start_labelled(labels);
    let mut tx = db.begin().await?;
    for chunk in events.chunks(1_000) {
        tx.enqueue_all(chunk).await?;
    }
    tx.commit().await?;
    let published = "SELECT COUNT(*) FROM outbox WHERE publicado_en IS NOT NULL";
    drained(
        fleet,
        args,
        "relay",
        &db,
        published,
        ("outbox", "publicado_en"),
        sampler,
    )
    .await
}

async fn consumers(
    k: usize,
    system: &System,
    fleet: &mut Fleet,
    labels: Labels,
    args: &ScaleArgs,
) -> anyhow::Result<Scaled> {
    let stock = system.inventario().await.context("opening inventario")?;
    fill_stock(&stock).await?;
    let db = stock.db().clone();
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, TOPIC).await?;
    let messages = topic_messages(TOPIC, args.events, args.aggregates)?;
    fleet.start_each("inventario", k).await?;
    // The members form their group before the backlog comes, as long-running ones have;
    // the topic is then filled faster than they drain it.
    tokio::time::sleep(GROUP_SETTLE).await;
    let sampler = CpuSampler::start_labelled(labels);
    prefill_topic(broker.publisher().as_ref(), &messages).await?;
    let applied = "SELECT COUNT(*) FROM mensajes_procesados";
    let span = ("mensajes_procesados", "procesado_en");
    drained(fleet, args, "inventario", &db, applied, span, sampler).await
}

async fn order_takers(
    k: usize,
    fleet: &mut Fleet,
    labels: Labels,
    args: &ScaleArgs,
) -> anyhow::Result<Scaled> {
    let addresses = fleet
        .start_each("pedidos", k)
        .await?
        .into_iter()
        .map(|a| a.context("pedidos named no HTTP address in its ready line"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(2 + args.seconds);
    let mut clients = Vec::with_capacity(args.clients);
    for c in 0..args.clients.max(1) {
        let (http, counting, accepted, refused) = (
            http.clone(),
            Arc::clone(&counting),
            Arc::clone(&accepted),
            Arc::clone(&refused),
        );
        let url = format!("http://{}/pedidos", addresses[c % addresses.len()]);
        clients.push(tokio::spawn(async move {
            let mut n = 0usize;
            while Instant::now() < until {
                let body = json!({
                    "id": format!("P-scale-{c}-{n}"),
                    "cliente": "bench",
                    "mercado": "girona",
                    "lineas": [
                        {"producto": super::workload::product(n), "cantidad": 1, "precio_centimos": 350},
                        {"producto": super::workload::product(n + 1), "cantidad": 1, "precio_centimos": 350},
                    ],
                });
                n += 1;
                let created = matches!(
                    http.post(&url).json(&body).send().await,
                    Ok(r) if r.status().as_u16() == 201
                );
                if counting.load(Ordering::Relaxed) {
                    let tally = if created { &accepted } else { &refused };
                    tally.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sampler = CpuSampler::start_labelled(labels);
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    for client in clients {
        client.await.context("an HTTP client")?;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-3);
    let cpu = sampler.stop().await;
    if !fleet.all_running() {
        bail!("a pedidos process stopped during the load");
    }
    let refused = refused.load(Ordering::Relaxed);
    if refused > 0 {
        progress(format!("pedidos x{k}: {refused} orders not answered 201"));
    }
    Ok(Scaled {
        rate: accepted.load(Ordering::Relaxed) as f64 / elapsed,
        cpu,
    })
}

/// Waits until `done` (a count on `db`) reaches the run's events, failing when a process
/// stopped or the timeout passed; then the rate over the span of `table.column` and the CPU
/// since `sampler` started.
async fn drained(
    fleet: &mut Fleet,
    args: &ScaleArgs,
    label: &str,
    db: &Db,
    done: &'static str,
    (table, column): (&str, &str),
    sampler: CpuSampler,
) -> anyhow::Result<Scaled> {
    let want = i64::try_from(args.events)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let now = count(db, done).await?;
        if now >= want {
            break;
        }
        if !fleet.all_running() {
            bail!("a {label} process stopped during the drain");
        }
        if Instant::now() >= deadline {
            bail!("{label}: {now} of {want} after {} s", args.timeout);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu = sampler.stop().await;
    let (first, last) = span_ms(db, table, column).await?;
    Ok(Scaled {
        rate: per_second(args.events, first, last),
        cpu,
    })
}

async fn count(db: &Db, sql: &'static str) -> anyhow::Result<i64> {
    Ok(db
        .scalar::<i64>(entrega::db::query(sql))
        .await?
        .unwrap_or(0))
}

/// The first and last times in `column` of `table`, in epoch ms, as the database wrote them.
async fn span_ms(db: &Db, table: &str, column: &str) -> anyhow::Result<(i64, i64)> {
    let sqlite = format!(
        "SELECT CAST(round((julianday(min({column})) - 2440587.5) * 86400000.0) AS INTEGER), \
         CAST(round((julianday(max({column})) - 2440587.5) * 86400000.0) AS INTEGER) FROM {table}"
    );
    let postgres = format!(
        "SELECT (extract(epoch FROM min({column})) * 1000)::bigint, \
         (extract(epoch FROM max({column})) * 1000)::bigint FROM {table}"
    );
    let span: Option<(Option<i64>, Option<i64>)> =
        db.fetch_optional(query_each(sqlite, postgres)).await?;
    match span {
        Some((Some(first), Some(last))) => Ok((first, last)),
        _ => bail!("no time in {table}.{column}"),
    }
}

/// `n` over the span from `first` to `last` (epoch ms), at least one millisecond.
fn per_second(n: usize, first: i64, last: i64) -> f64 {
    n as f64 * 1000.0 / (last - first).max(1) as f64
}
