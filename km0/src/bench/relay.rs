//! `km0 bench relay`: how fast the entrega relay drains a prefilled outbox into the broker,
//! with one and with several relay instances, against pgbench running the same statements
//! (on Kafka, the outbox's statements only: the appends go to the cluster).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use entrega::{CancellationToken, Relay, RelayConfig, TopicRouting};
use entrega_core::{now_ms, Publisher, SystemClock};
use serde_json::json;

use super::pgbench::{rate, relay_ceiling};
use super::report::{BenchReport, Measurement, Target};
use super::timed_publisher::TimedPublisher;
use super::timed_reader::{ReaderTimes, TimedReader};
use super::workload::{outbox_events, prefill_outbox};
use super::{progress, BenchRun, Common};
use crate::services::pedidos::{AGGREGATE, SOURCE};
use crate::wiring::relay::RelaySource;
use crate::wiring::{ensure_topic_and_dlq, Broker, DEFAULT_LEASE_TTL};
use entrega::db::{query_each, Db};

/// The relay must reach this share of the pgbench ceiling, in percent.
const TARGET_PERCENT: f64 = 90.0;

/// `km0 bench relay`.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Events prefilled in the outbox.
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Orders the events belong to (each gets `events / aggregates` in turn).
    #[arg(long, default_value_t = 10_000)]
    pub aggregates: usize,
    /// Relay instance counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub relays: Vec<usize>,
    /// Rows per lane per batch (the relay's `batch_size`).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Seconds one drain may take before the run fails.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Where the relay reads the outbox, comma separated: `poll`, `wal` (PostgreSQL; one
    /// relay per slot, so with one instance only). Sources alternate within each run.
    #[arg(long, value_delimiter = ',', default_value = "poll", value_enum)]
    pub sources: Vec<RelaySource>,
    /// Also measure each source at this steady rate of single-row transactions (rows/s):
    /// commit-to-confirmation latency and CPU per 100,000 events. 0: not measured.
    #[arg(long, default_value_t = 0)]
    pub steady_rate: u32,
    /// Seconds of each steady measurement.
    #[arg(long, default_value_t = 60)]
    pub steady_seconds: u64,
}

impl RelayArgs {
    /// The settings other benches start from: the polling relay only, no steady rate (the
    /// rest is theirs to set).
    pub fn polling() -> Self {
        Self {
            events: 100_000,
            aggregates: 10_000,
            relays: vec![1],
            batch: 100,
            timeout: 600,
            sources: vec![RelaySource::Poll],
            steady_rate: 0,
            steady_seconds: 60,
        }
    }
}

/// CPU seconds per 100k events a relay may spend at a steady rate, with PostgreSQL's share:
/// what a Debezium 3.6 connector in Kafka Connect spent here at 500 rows/s.
const RELAY_CPU_TARGET_S: f64 = 45.0;

/// The WAL relay must drain a backlog at least this many times as fast as the polling relay.
const WAL_TARGET_RATIO: f64 = 1.5;

/// Runs every configuration `runs` times, alternating engine and ceiling so both see the same
/// machine weather.
pub(crate) async fn run(common: &Common, args: &RelayArgs) -> anyhow::Result<BenchReport> {
    let timeout = Duration::from_secs(args.timeout);
    let mut rows = Vec::new();
    let poll = args.sources.contains(&RelaySource::Poll);
    let wal = args.sources.contains(&RelaySource::Wal);
    if wal && common.place.postgres_server().is_none() {
        bail!("--sources wal reads PostgreSQL's WAL: --database must be postgres://");
    }
    if wal {
        rows.extend(wal_backlog(common, args, poll).await?);
    }
    if args.steady_rate > 0 {
        rows.extend(steady_rows(common, args).await?);
    }
    if !poll {
        return Ok(report(common, args, rows));
    }
    for &relays in &args.relays {
        let relays = relays.max(1);
        let mut engine = Vec::with_capacity(common.runs);
        let mut in_publish = Vec::with_capacity(common.runs);
        let mut in_read = Vec::with_capacity(common.runs);
        let mut in_mark = Vec::with_capacity(common.runs);
        let mut ceiling = Vec::with_capacity(common.runs);
        for run in 1..=common.runs {
            progress(format!("relay x{relays}, run {run}/{}", common.runs));
            let drained = measure(common, args, relays).await?;
            engine.push(drained.rate);
            in_publish.push(drained.publish_percent);
            in_read.push(drained.read_percent);
            in_mark.push(drained.mark_percent);
            if let Some(binary) = &common.pgbench {
                ceiling.push(
                    relay_ceiling(
                        common,
                        binary,
                        (args.events, args.aggregates, args.batch),
                        relays,
                        timeout,
                    )
                    .await?,
                );
            }
        }
        let ratios: Vec<f64> = engine
            .iter()
            .zip(&ceiling)
            .map(|(e, c)| 100.0 * e / c)
            .collect();
        rows.push(Measurement::new(
            format!("relay x{relays} (entrega)"),
            "events/s",
            engine,
        ));
        rows.push(Measurement::new(
            format!("relay x{relays}: time waiting for the broker"),
            "%",
            in_publish,
        ));
        rows.push(Measurement::new(
            format!("relay x{relays}: time reading pending rows"),
            "%",
            in_read,
        ));
        rows.push(Measurement::new(
            format!("relay x{relays}: time marking rows"),
            "%",
            in_mark,
        ));
        if !ceiling.is_empty() {
            rows.push(Measurement::new(
                format!("ceiling x{relays} (pgbench)"),
                "events/s",
                ceiling,
            ));
            rows.push(
                Measurement::new(format!("relay x{relays} / ceiling"), "%", ratios)
                    .with_target(|m| Target::at_least(TARGET_PERCENT, m)),
            );
        }
    }
    Ok(report(common, args, rows))
}

fn report(common: &Common, args: &RelayArgs, rows: Vec<Measurement>) -> BenchReport {
    BenchReport {
        bench: "relay".to_owned(),
        backend: common.place.backend().to_owned(),
        setup: format!(
            "drain {} events over {} aggregates into the {}, batches of {}",
            args.events,
            args.aggregates,
            if common.place.on_kafka() {
                "kafka broker"
            } else {
                "log broker"
            },
            args.batch
        ),
        settings: json!({
            "events": args.events,
            "aggregates": args.aggregates,
            "relays": args.relays,
            "batch": args.batch,
            "sources": args.sources.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "steady_rate": args.steady_rate,
            "steady_seconds": args.steady_seconds,
        }),
        rows,
    }
}

/// The backlog drained by one WAL relay, (with `poll`) one polling relay and (with the
/// ceilings) `pg_recvlogical`, alternating.
async fn wal_backlog(
    common: &Common,
    args: &RelayArgs,
    poll: bool,
) -> anyhow::Result<Vec<Measurement>> {
    let (mut wal, mut polled, mut ceiling) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=common.runs {
        progress(format!("relay wal, run {run}/{}", common.runs));
        let fresh = common.place.fresh();
        let drained = super::relay_wal::drain(&fresh, args).await;
        common.cleanup(&fresh).await?;
        let drained = drained?;
        progress(format!("relay wal: {:.0} events/s", drained.rate));
        wal.push(drained.rate);
        if poll {
            progress(format!("relay poll, run {run}/{}", common.runs));
            polled.push(measure(common, args, 1).await?.rate);
        }
        if let Some(binary) = &common.recvlogical {
            progress(format!("ceiling pg_recvlogical, run {run}/{}", common.runs));
            let fresh = common.place.fresh();
            let drained = super::relay_wal_ceiling::drain(&fresh, args, binary).await;
            common.cleanup(&fresh).await?;
            ceiling.push(drained?);
        }
    }
    let mut rows = vec![Measurement::new("relay x1 (wal)", "events/s", wal.clone())];
    if !ceiling.is_empty() {
        let ratios = wal
            .iter()
            .zip(&ceiling)
            .map(|(w, c)| 100.0 * w / c)
            .collect();
        rows.push(Measurement::new(
            "ceiling (pg_recvlogical, the stream alone)",
            "events/s",
            ceiling.clone(),
        ));
        rows.push(Measurement::new("relay x1 (wal) / ceiling", "%", ratios));
    }
    if poll {
        let ratios = wal.iter().zip(&polled).map(|(w, p)| w / p).collect();
        rows.push(Measurement::new(
            "relay x1 (poll)",
            "events/s",
            polled.clone(),
        ));
        rows.push(
            Measurement::new("relay x1: wal / poll", "x", ratios)
                .with_target(|m| Target::at_least(WAL_TARGET_RATIO, m)),
        );
        if !ceiling.is_empty() {
            // What the target asks for, against what the server's stream alone gives.
            let ratios = ceiling.iter().zip(&polled).map(|(c, p)| c / p).collect();
            rows.push(Measurement::new("ceiling / poll", "x", ratios));
        }
    }
    Ok(rows)
}

/// The writer alone, then each source, at the steady rate, alternating.
async fn steady_rows(common: &Common, args: &RelayArgs) -> anyhow::Result<Vec<Measurement>> {
    let mut by_source: Vec<(Option<RelaySource>, Vec<super::relay_steady::Steady>)> =
        std::iter::once(None)
            .chain(args.sources.iter().map(|s| Some(*s)))
            .map(|s| (s, Vec::new()))
            .collect();
    for run in 1..=common.runs {
        for (source, runs) in &mut by_source {
            let name = source.map_or("the writer alone", RelaySource::name);
            progress(format!(
                "{name} at {}/s, run {run}/{}",
                args.steady_rate, common.runs
            ));
            let fresh = common.place.fresh();
            let steady = super::relay_steady::measure(
                &fresh,
                *source,
                args.steady_rate,
                args.steady_seconds,
            )
            .await;
            common.cleanup(&fresh).await?;
            runs.push(steady?);
        }
    }
    let rate = args.steady_rate;
    let alone_runs = by_source
        .first()
        .map(|(_, runs)| runs.clone())
        .unwrap_or_default();
    let alone: Vec<f64> = alone_runs.iter().map(|s| s.cpu_s_per_100k).collect();
    let mut rows = vec![Measurement::new(
        format!("the writer alone at {rate}/s: CPU of km0 and PostgreSQL per 100k events"),
        "s",
        alone.clone(),
    )];
    for (source, runs) in by_source.into_iter().skip(1) {
        let Some(source) = source else { continue };
        let name = source.name();
        rows.push(Measurement::new(
            format!("{name} at {rate}/s: commit to broker, p50"),
            "ms",
            runs.iter().map(|s| s.p50_ms).collect(),
        ));
        rows.push(Measurement::new(
            format!("{name} at {rate}/s: commit to broker, p99"),
            "ms",
            runs.iter().map(|s| s.p99_ms).collect(),
        ));
        rows.push(Measurement::new(
            format!("{name} at {rate}/s: CPU of km0 and PostgreSQL per 100k events"),
            "s",
            runs.iter().map(|s| s.cpu_s_per_100k).collect(),
        ));
        rows.push(Measurement::new(
            format!("{name} at {rate}/s: of which PostgreSQL's"),
            "s",
            runs.iter().map(|s| s.postgres_s_per_100k).collect(),
        ));
        // Each run against the writer alone of the same round.
        let own = runs
            .iter()
            .zip(&alone)
            .map(|(s, a)| s.cpu_s_per_100k - a)
            .collect();
        rows.push(Measurement::new(
            format!("{name} at {rate}/s: the relay's own CPU (less the writer alone)"),
            "s",
            own,
        ));
        // As Debezium's was measured: the relay and all of PostgreSQL, the work of the
        // writer's inserts included; only the writer's own process left out.
        let with_postgres = runs
            .iter()
            .zip(&alone_runs)
            .map(|(s, a)| s.cpu_s_per_100k - (a.cpu_s_per_100k - a.postgres_s_per_100k))
            .collect();
        rows.push(
            Measurement::new(
                format!("{name} at {rate}/s: the relay and PostgreSQL (less the writer's process)"),
                "s",
                with_postgres,
            )
            .with_target(|m| Target::at_most(RELAY_CPU_TARGET_S, m)),
        );
    }
    Ok(rows)
}

/// What one drain measured.
pub(crate) struct Drained {
    /// Events/s from the start of the relays to the last mark.
    pub(crate) rate: f64,
    /// Share of the relays' time spent in `publish` (waiting for the broker's
    /// confirmations), the rest going to the outbox's statements and the relay itself.
    pub(crate) publish_percent: f64,
    /// Share of the relays' time spent reading pending rows (concurrent with the publish
    /// of the round before, see `entrega::Relay`).
    pub(crate) read_percent: f64,
    /// Share of the relays' time spent marking rows published (concurrent with the read).
    pub(crate) mark_percent: f64,
}

/// One drain on fresh databases.
async fn measure(common: &Common, args: &RelayArgs, relays: usize) -> anyhow::Result<Drained> {
    let run = common.place.fresh();
    let result = drain(&run, args, relays).await;
    common.cleanup(&run).await?;
    let drained = result?;
    progress(format!(
        "relay x{relays} (entrega): {:.0} events/s; of the time, {:.0}% in publish, {:.0}% \
         reading, {:.0}% marking",
        drained.rate, drained.publish_percent, drained.read_percent, drained.mark_percent
    ));
    Ok(drained)
}

async fn drain(run: &BenchRun, args: &RelayArgs, instances: usize) -> anyhow::Result<Drained> {
    let pedidos = run.system.pedidos().await.context("opening pedidos")?;
    let broker = run.system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, &run.topic).await?;
    prefill_outbox(pedidos.db(), &outbox_events(args.events, args.aggregates)?).await?;
    let drained = drain_prefilled(run, pedidos.db(), &broker, args, instances).await?;
    pedidos.db().close().await;
    broker.close().await;
    Ok(drained)
}

/// Drains the `args.events` rows already pending in the outbox of `pedidos` into `run.topic`
/// with `instances` relays.
pub(crate) async fn drain_prefilled(
    run: &BenchRun,
    pedidos: &Db,
    broker: &Broker,
    args: &RelayArgs,
    instances: usize,
) -> anyhow::Result<Drained> {
    let ids: Vec<String> = (0..instances).map(|i| format!("bench-relay-{i}")).collect();
    // Long-running relays have split the lanes long before a backlog builds up: let them
    // join and balance before the clock starts, or the first one would hold every lane for
    // a third of the lease period.
    // Each relay below starts a later life of one of these names, and takes its share back
    // at once.
    let leases = pedidos.outbox().leases;
    let holders: Vec<entrega::seams::Holder> = ids
        .iter()
        .map(|id| entrega::seams::Holder::new(id.clone(), now_ms()))
        .collect();
    for _round in 0..3 {
        for holder in &holders {
            leases.balance(holder, now_ms(), DEFAULT_LEASE_TTL).await?;
        }
    }
    let busy_us = Arc::new(AtomicU64::new(0));
    let publisher: Arc<dyn Publisher> = Arc::new(TimedPublisher::new(
        broker.publisher(),
        Arc::clone(&busy_us),
    ));
    let times = Arc::new(ReaderTimes::default());
    let relays: Vec<Arc<Relay>> = ids
        .iter()
        .map(|id| {
            let mut config =
                RelayConfig::new(SOURCE, TopicRouting::new().route(AGGREGATE, &run.topic));
            config.instance_id = id.clone();
            config.batch_size = args.batch.max(1);
            config.lease_ttl = DEFAULT_LEASE_TTL;
            config.poll_interval = Duration::from_millis(200);
            let mut ports = pedidos.outbox();
            ports.reader = Arc::new(TimedReader::new(ports.reader, Arc::clone(&times)));
            Arc::new(Relay::new(
                ports,
                Arc::clone(&publisher),
                Arc::new(SystemClock),
                config,
            ))
        })
        .collect();

    let stop = CancellationToken::new();
    let start_ms = now_ms();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(relays.len());
    for relay in &relays {
        let (relay, stop) = (Arc::clone(relay), stop.clone());
        tasks.push(tokio::spawn(async move { relay.run(stop).await }));
    }
    let drained = wait_published(
        &format!("relay x{instances}"),
        args,
        || relays.iter().map(|r| r.stats().published()).sum(),
        || tasks.iter().any(|t| t.is_finished()),
    )
    .await;
    let drain_us = started.elapsed().as_micros() as f64;
    stop.cancel();
    for task in tasks {
        task.await.context("relay task")?.context("relay")?;
    }
    drained?;
    let share = |us: &AtomicU64| {
        100.0 * us.load(Ordering::Relaxed) as f64 / (drain_us * instances as f64).max(1.0)
    };

    let end_ms = all_published(run, pedidos, broker, args).await?;
    Ok(Drained {
        rate: rate(args.events, start_ms, end_ms),
        publish_percent: share(&busy_us),
        read_percent: share(&times.read_us),
        mark_percent: share(&times.mark_us),
    })
}

/// Waits until `published()` reaches the run's events, showing progress as `label`; an
/// error when `stopped()` (a relay task ended) or the run's timeout passes first.
pub(crate) async fn wait_published(
    label: &str,
    args: &RelayArgs,
    published: impl Fn() -> u64,
    stopped: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let want = u64::try_from(args.events)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let progress = super::progress::Progress::new(label, want);
    loop {
        let published = published();
        progress.set(published);
        if published >= want {
            return Ok(());
        }
        if stopped() {
            bail!("a relay stopped during the drain");
        }
        if Instant::now() >= deadline {
            bail!("{published} of {want} events after the timeout");
        }
        // In-process counters: looking costs nothing, so look often.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Checks after a drain that no outbox row is pending and the run's topic holds every
/// event; returns when the last row was marked published, in epoch ms.
pub(crate) async fn all_published(
    run: &BenchRun,
    pedidos: &Db,
    broker: &Broker,
    args: &RelayArgs,
) -> anyhow::Result<i64> {
    let want = u64::try_from(args.events)?;
    let status = pedidos.outbox().maintenance.status(now_ms()).await?;
    let on_topic = broker.topic_total(&run.topic).await?;
    if status.pending != 0 || on_topic < want {
        bail!(
            "after the drain: {} pending, {on_topic} on the topic",
            status.pending
        );
    }
    last_mark_ms(pedidos).await
}

/// When the last outbox row was marked published, in epoch ms.
pub(crate) async fn last_mark_ms(db: &Db) -> anyhow::Result<i64> {
    let last: Option<Option<i64>> = db
        .scalar(query_each(
            "SELECT CAST(round((julianday(max(publicado_en)) - 2440587.5) * 86400000.0)
                    AS INTEGER) FROM outbox",
            "SELECT (extract(epoch FROM max(publicado_en)) * 1000)::bigint FROM outbox",
        ))
        .await?;
    let last = last.flatten();
    last.context("no row was marked published")
}
