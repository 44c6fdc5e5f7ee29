//! `km0 bench consume`: how fast the inventario consumer (the entrega worker and the stock
//! consumer's batch transaction) drains a prefilled `pedidos.eventos`, against pgbench
//! running the same statements.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use entrega::{CancellationToken, Worker, WorkerConfig};
use entrega_core::{now_ms, Subscriber};
use serde_json::json;

use super::pgbench::{consume_ceiling, rate};
use super::report::{BenchReport, Measurement, Target};
use super::timed_subscriber::{BrokerTime, TimedSubscriber};
use super::workload::{fill_stock, prefill_topic, settle, topic_messages};
use super::{progress, BenchRun, Common};
use crate::services::inventario::{BatchMode, StockConsumer, CONSUMER};
use crate::wiring::{ensure_topic_and_dlq, Broker};
use entrega::db::{query, Db};

/// Messages per second the consumer must sustain.
const TARGET_RATE: f64 = 5_000.0;

/// `km0 bench consume`.
#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    /// Messages prefilled on the topic.
    #[arg(long, default_value_t = 50_000)]
    pub messages: usize,
    /// Orders the messages belong to (the partition keys), round robin. An order's first
    /// event takes its stock; a later one finds its reservation and only records its key.
    #[arg(long, default_value_t = 50_000)]
    pub aggregates: usize,
    /// Records per poll, which is also the consumer's transaction size; default every
    /// consumer's (`entrega::DEFAULT_MAX_BATCH`).
    #[arg(long, default_value_t = entrega::DEFAULT_MAX_BATCH)]
    pub batch: usize,
    /// Apply each batch event by event (one statement per event) instead of set-based (a
    /// constant number of statements per batch); the ceiling runs the same statements.
    #[arg(long)]
    pub per_event: bool,
    /// Workers (members of the consumer group) in this process.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Seconds one drain may take before the run fails.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

impl ConsumeArgs {
    /// How the consumer applies its batches.
    pub fn mode(&self) -> BatchMode {
        if self.per_event {
            BatchMode::PerEvent
        } else {
            BatchMode::SetBased
        }
    }
}

/// Runs the drain `runs` times, alternating with the ceiling.
pub(crate) async fn run(common: &Common, args: &ConsumeArgs) -> anyhow::Result<BenchReport> {
    let timeout = Duration::from_secs(args.timeout);
    let workers = args.workers.max(1);
    let mut engine = Vec::with_capacity(common.runs);
    let mut in_poll = Vec::with_capacity(common.runs);
    let mut in_commit = Vec::with_capacity(common.runs);
    let mut ceiling = Vec::with_capacity(common.runs);
    let mut pipelined = Vec::with_capacity(common.runs);
    let sizes = (args.messages, args.aggregates, args.batch);
    let mode = args.mode();
    for run in 1..=common.runs {
        progress(format!("consume x{workers}, run {run}/{}", common.runs));
        let drained = measure(common, args, workers).await?;
        engine.push(drained.rate);
        in_poll.push(drained.poll_percent);
        in_commit.push(drained.commit_percent);
        // The ceiling is one client: the stock rows every order touches serialise consumers.
        if let Some(binary) = common.pgbench.as_deref().filter(|_| workers == 1) {
            ceiling.push(consume_ceiling(common, binary, sizes, false, mode, timeout).await?);
            pipelined.push(consume_ceiling(common, binary, sizes, true, mode, timeout).await?);
        }
    }
    let ratios: Vec<f64> = engine
        .iter()
        .zip(&ceiling)
        .map(|(e, c)| 100.0 * e / c)
        .collect();
    let how = match mode {
        BatchMode::SetBased => "set-based",
        BatchMode::PerEvent => "per event",
    };
    let mut rows = vec![
        Measurement::new(
            format!("consume x{workers} (entrega, {how})"),
            "msgs/s",
            engine,
        )
        .with_target(|m| Target::at_least(TARGET_RATE, m)),
        Measurement::new("time in poll", "%", in_poll),
        Measurement::new("time in offset commit", "%", in_commit),
    ];
    if !ceiling.is_empty() {
        // On Kafka the poll and the offset commit leave the database: the ceilings, which
        // run the log transport's turn (two of its ~100 statements per batch), still bound
        // the stock SQL from above.
        let of = if common.place.on_kafka() {
            "pgbench, log transport's turn"
        } else {
            "pgbench"
        };
        rows.push(Measurement::new(
            format!("ceiling x1 ({of})"),
            "msgs/s",
            ceiling,
        ));
        rows.push(Measurement::new(
            format!("consume x{workers} / ceiling"),
            "%",
            ratios,
        ));
        rows.push(Measurement::new(
            "same SQL pipelined (pgbench)",
            "msgs/s",
            pipelined,
        ));
    }
    Ok(BenchReport {
        bench: "consume".to_owned(),
        backend: common.place.backend().to_owned(),
        setup: format!(
            "drain {} pedido.creado (2 lines each) over {} aggregates, polls of {}, {how}",
            args.messages, args.aggregates, args.batch
        ),
        settings: json!({
            "messages": args.messages,
            "aggregates": args.aggregates,
            "batch": args.batch,
            "workers": workers,
            "per_event": args.per_event,
        }),
        rows,
    })
}

/// What one drain measured.
pub(crate) struct Drained {
    /// Messages/s from the group's first hand-out of partitions to the last offset commit.
    rate: f64,
    /// Share of the workers' time spent in `poll` (records from the broker).
    poll_percent: f64,
    /// Share of the workers' time spent committing offsets; the rest is the consumer's
    /// transactions and the worker itself.
    commit_percent: f64,
}

async fn measure(common: &Common, args: &ConsumeArgs, workers: usize) -> anyhow::Result<Drained> {
    let run = common.place.fresh();
    let result = drain(&run, args, workers).await;
    common.cleanup(&run).await?;
    let drained = result?;
    progress(format!(
        "consume x{workers} (entrega): {:.0} msgs/s, {:.0}% in poll, {:.0}% in commit",
        drained.rate, drained.poll_percent, drained.commit_percent
    ));
    Ok(drained)
}

pub(crate) async fn drain(
    run: &BenchRun,
    args: &ConsumeArgs,
    workers: usize,
) -> anyhow::Result<Drained> {
    let stock = run
        .system
        .inventario()
        .await
        .context("opening inventario")?;
    fill_stock(&stock).await?;
    let broker = run.system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, &run.topic).await?;
    prefill_topic(
        broker.publisher().as_ref(),
        &topic_messages(&run.topic, args.messages, args.aggregates)?,
    )
    .await?;
    if let Some(db) = broker.log_db() {
        settle(&db, &["entrega_log"]).await?;
    }

    let stock = stock.with_batch_mode(args.mode());
    let consumer = Arc::new(StockConsumer::new(stock.clone()));
    let stats = consumer.stats();
    let time = Arc::new(BrokerTime::default());
    let subscriber: Arc<dyn Subscriber> =
        Arc::new(TimedSubscriber::new(broker.subscriber(), Arc::clone(&time)));
    let stop = CancellationToken::new();
    let start_ms = now_ms();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for i in 0..workers {
        let mut config = WorkerConfig::new(&run.group, &run.topic);
        config.member = format!("bench-worker-{i}");
        config.max_batch = args.batch.max(1);
        let worker = Worker::new(
            Arc::clone(&subscriber),
            broker.publisher(),
            consumer.router(),
            config,
        )
        .with_admin(broker.admin());
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move { worker.run(stop).await }));
    }
    let want = u64::try_from(args.messages)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    // The log stamps its commits; Kafka does not say when, so the end there is when the
    // commits are first seen (looked at every few ms).
    let progress = super::progress::Progress::new(&format!("consume x{workers}"), want);
    let drained = loop {
        let processed = stats.snapshot().processed;
        progress.set(processed);
        // The offsets follow each batch's commit at once; the drain ends with the last of them.
        if processed >= want && committed(&broker, run).await? >= want {
            break Ok(now_ms());
        }
        if tasks.iter().any(|t| t.is_finished()) {
            break Err(anyhow::anyhow!("a worker stopped during the drain"));
        }
        if Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "{processed} of {want} consumed after the timeout"
            ));
        }
        let pause = if processed >= want { 1 } else { 5 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    };
    drop(progress);
    // From the group's first hand-out of partitions: forming a Kafka group takes seconds
    // (nothing on the log transport), which is not the consumer's throughput.
    let joined = time.joined.get().copied().unwrap_or(started);
    let join_ms = i64::try_from(joined.duration_since(started).as_millis()).unwrap_or(0);
    let busy_us = (joined.elapsed().as_micros() as f64 * workers as f64).max(1.0);
    let share = |total: &AtomicU64| 100.0 * total.load(Ordering::Relaxed) as f64 / busy_us;
    let (poll_percent, commit_percent) = (share(&time.poll_us), share(&time.commit_us));
    stop.cancel();
    for task in tasks {
        task.await.context("worker task")?.context("worker")?;
    }
    let seen_ms = drained?;

    let recorded = stock.processed(CONSUMER).await?;
    let snapshot = stats.snapshot();
    if recorded != want || snapshot.refused != 0 {
        bail!(
            "after the drain: {recorded} keys recorded, {} refused",
            snapshot.refused
        );
    }
    let end_ms = match broker.log_db() {
        Some(db) => last_commit_ms(&db, &run.group).await?,
        None => seen_ms,
    };
    stock.db().close().await;
    broker.close().await;
    Ok(Drained {
        rate: rate(args.messages, start_ms + join_ms, end_ms),
        poll_percent,
        commit_percent,
    })
}

/// Messages the run's group has committed past, over every partition.
async fn committed(broker: &Broker, run: &BenchRun) -> anyhow::Result<u64> {
    let offsets = broker.committed(&run.group, &run.topic).await?;
    Ok(offsets
        .iter()
        .map(|(_, next)| u64::try_from(*next).unwrap_or(0))
        .sum())
}

/// When `group` last committed offsets in the log's database, in epoch ms.
async fn last_commit_ms(db: &Db, group: &str) -> anyhow::Result<i64> {
    const SQL: &str = "SELECT max(committed_at_ms) FROM entrega_group_offsets WHERE group_id = $1";
    let last: Option<Option<i64>> = db.scalar(query(SQL).bind(group)).await?;
    let last = last.flatten();
    last.context("no offsets were committed")
}
