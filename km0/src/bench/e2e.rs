//! `km0 bench e2e`: commit-to-consume latency at a fixed arrival rate.
//!
//! A producer commits orders (`OrderStore::create`: the order and its outbox row in one
//! transaction) at a fixed rate while the relay, the broker (or its client) and the inventario
//! worker run in this process. Arrivals are scheduled by their intended start time and each
//! runs in its own task, so a slow system does not slow the arrivals down (no coordinated
//! omission); see [`super::arrivals`]. The warm-up orders are consumed before the measured
//! ones start.
//! An event's latency runs from its producer's commit returning to the consumer's transaction
//! for it committing, recorded per `id_evento` by a thin wrapper around the stock consumer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context as _};
use async_trait::async_trait;
use clap::Args;
use entrega::{
    CancellationToken, Handler, Message, Relay, RelayConfig, Router, TopicRouting, Worker,
    WorkerConfig,
};
use entrega_core::headers::ID_EVENTO;
use entrega_core::{HandlerError, SystemClock};
use hdrhistogram::Histogram;
use serde_json::json;
use uuid::Uuid;

use super::arrivals::{all_consumed, now_us, record, Instants, Producer};
use super::report::{BenchReport, Measurement, Target};
use super::workload::fill_stock;
use super::{progress, BenchRun, Common};
use crate::services::inventario::StockConsumer;
use crate::services::pedidos::{
    AGGREGATE, ORDER_CANCELLED, ORDER_CREATED, ORDER_PAID, PARTITIONS, SOURCE,
};
use crate::wiring::{ensure_topic_and_dlq, Broker};

/// The p99 latency must stay under this many milliseconds.
const TARGET_P99_MS: f64 = 25.0;

/// `km0 bench e2e`.
#[derive(Debug, Clone, Args)]
pub struct E2eArgs {
    /// Orders committed per second.
    #[arg(long, default_value_t = 500)]
    pub rate: u32,
    /// Seconds of measured arrivals.
    #[arg(long, default_value_t = 30)]
    pub duration: u64,
    /// Orders placed at the same rate before the measured ones (connections, leases, caches);
    /// their latencies are not counted.
    #[arg(long, default_value_t = 500)]
    pub warmup: usize,
    /// Seconds to wait for the last orders to be consumed.
    #[arg(long, default_value_t = 60)]
    pub drain_timeout: u64,
}

/// The stock consumer, noting when each event's transaction committed.
struct Timed {
    inner: Arc<StockConsumer>,
    consumed: Instants,
}

#[async_trait]
impl Handler for Timed {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let result = self.inner.handle(msg).await;
        if result.is_ok() {
            record(&self.consumed, msg.envelope.id, now_us());
        }
        result
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        let results = self.inner.handle_batch(msgs).await;
        // The batch's transaction has committed when handle_batch returns.
        let now = now_us();
        for (msg, result) in msgs.iter().zip(&results) {
            if result.is_ok() {
                record(&self.consumed, msg.envelope.id, now);
            }
        }
        results
    }
}

/// Latencies of one run, in microseconds.
struct RunResult {
    latency: Histogram<u64>,
    /// Producer commit to the log append (outbox, relay, publish).
    relay: Histogram<u64>,
    /// Log append to the consumer's commit (wake-up, poll, batch transaction).
    consumer: Histogram<u64>,
    commit: Histogram<u64>,
    achieved_rate: f64,
}

/// Runs the load `runs` times and reports the median of each percentile.
pub(crate) async fn run(common: &Common, args: &E2eArgs) -> anyhow::Result<BenchReport> {
    let mut results = Vec::with_capacity(common.runs);
    for run in 1..=common.runs {
        progress(format!("e2e at {}/s, run {run}/{}", args.rate, common.runs));
        let bench_run = common.place.fresh();
        let result = load(&bench_run, args).await;
        common.cleanup(&bench_run).await?;
        let result = result?;
        progress(format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} events",
            ms(result.latency.value_at_quantile(0.5)),
            ms(result.latency.value_at_quantile(0.99)),
            ms(result.latency.max()),
            result.latency.len()
        ));
        results.push(result);
    }
    let series = |f: &dyn Fn(&RunResult) -> f64| results.iter().map(f).collect::<Vec<f64>>();
    let quantile = |name: &str, pick: fn(&RunResult) -> &Histogram<u64>, q: f64| {
        Measurement::new(name, "ms", series(&|r| ms(pick(r).value_at_quantile(q))))
    };
    let rows = vec![
        quantile("latency p50", |r| &r.latency, 0.5),
        quantile("latency p90", |r| &r.latency, 0.9),
        quantile("latency p99", |r| &r.latency, 0.99)
            .with_target(|m| Target::at_most(TARGET_P99_MS, m)),
        quantile("latency max", |r| &r.latency, 1.0),
        Measurement::new(
            "events measured",
            "events",
            series(&|r| r.latency.len() as f64),
        ),
        quantile("relay leg p50", |r| &r.relay, 0.5),
        quantile("relay leg p99", |r| &r.relay, 0.99),
        quantile("consumer leg p50", |r| &r.consumer, 0.5),
        quantile("consumer leg p99", |r| &r.consumer, 0.99),
        quantile("producer commit p99", |r| &r.commit, 0.99),
        Measurement::new(
            "arrival rate achieved",
            "orders/s",
            series(&|r| r.achieved_rate),
        ),
    ];
    Ok(BenchReport {
        bench: "e2e".to_owned(),
        backend: common.place.backend().to_owned(),
        setup: format!(
            "orders committed at {}/s for {} s (after {} warm-up), relay + {} + \
             inventario worker in one process; latency = producer commit to consumer commit",
            args.rate,
            args.duration,
            args.warmup,
            if common.place.on_kafka() {
                "kafka"
            } else {
                "log broker"
            }
        ),
        settings: json!({
            "rate": args.rate,
            "duration_s": args.duration,
            "warmup": args.warmup,
        }),
        rows,
    })
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

async fn load(run: &BenchRun, args: &E2eArgs) -> anyhow::Result<RunResult> {
    let pedidos = run.system.pedidos().await.context("opening pedidos")?;
    let stock = run
        .system
        .inventario()
        .await
        .context("opening inventario")?;
    fill_stock(&stock).await?;
    let broker = run.system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, &run.topic).await?;

    let mut relay_config =
        RelayConfig::new(SOURCE, TopicRouting::new().route(AGGREGATE, &run.topic));
    relay_config.instance_id = "bench-relay".to_owned();
    relay_config.poll_interval = Duration::from_millis(200);
    let relay = Relay::new(
        pedidos.db().outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        relay_config,
    );
    let consumed: Instants = Arc::default();
    let handler: Arc<dyn Handler> = Arc::new(Timed {
        inner: Arc::new(StockConsumer::new(stock.clone())),
        consumed: Arc::clone(&consumed),
    });
    let router = Router::new()
        .route(ORDER_CREATED, handler)
        .ignore(ORDER_PAID)
        .ignore(ORDER_CANCELLED);
    let mut worker_config = WorkerConfig::new(&run.group, &run.topic);
    worker_config.member = "bench-worker".to_owned();
    worker_config.max_batch = run.system.max_batch();
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        router,
        worker_config,
    )
    .with_admin(broker.admin());
    let stop = CancellationToken::new();
    let relay_task = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let worker_task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });

    // Warm-up first, until all of it is consumed: connections, leases, caches, and on Kafka
    // the group's join (seconds), none of which the measured events should wait for.
    let mut producer = Producer::new(pedidos.clone(), args.rate)?;
    let limit = Duration::from_secs(args.drain_timeout);
    let measured = usize::try_from(u64::from(args.rate) * args.duration)?;
    let stopped = || relay_task.is_finished() || worker_task.is_finished();
    let phases = async {
        producer.arrive(0..args.warmup, true).await?;
        all_consumed(&producer, &consumed, limit, stopped).await?;
        let secs = producer
            .arrive(args.warmup..args.warmup + measured, false)
            .await?;
        all_consumed(&producer, &consumed, limit, stopped).await?;
        Ok::<_, anyhow::Error>(secs)
    }
    .await;
    stop.cancel();
    relay_task.await.context("relay task")?.context("relay")?;
    worker_task
        .await
        .context("worker task")?
        .context("worker")?;
    let arrival_secs = phases?;

    let appended = append_times(&broker, &run.topic).await?;
    let consumed = consumed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let legs = Legs::measure(&producer.events(), &consumed, &appended, &producer.warm)?;
    pedidos.db().close().await;
    stock.db().close().await;
    broker.close().await;
    Ok(RunResult {
        latency: legs.total,
        relay: legs.relay,
        consumer: legs.consumer,
        commit: producer.commit,
        achieved_rate: measured as f64 / arrival_secs,
    })
}

/// When each event was appended to `topic`, in epoch microseconds (the log stamps
/// milliseconds; Kafka records carry the producer's create time), by `id_evento`.
async fn append_times(broker: &Broker, topic: &str) -> anyhow::Result<HashMap<Uuid, i64>> {
    const PAGE: usize = 1_000;
    let mut times = HashMap::new();
    for partition in 0..PARTITIONS {
        let mut from = 0;
        loop {
            let records = broker.read(topic, partition, from, PAGE).await?;
            for record in &records {
                if let Some(id) = record.headers.get(ID_EVENTO) {
                    times.insert(Uuid::parse_str(id)?, record.timestamp_ms * 1_000);
                }
                from = record.offset + 1;
            }
            if records.len() < PAGE {
                break;
            }
        }
    }
    Ok(times)
}

/// The latency of every measured event, whole and split at the log append.
struct Legs {
    total: Histogram<u64>,
    relay: Histogram<u64>,
    consumer: Histogram<u64>,
}

impl Legs {
    fn measure(
        committed: &[(Uuid, i64)],
        consumed: &HashMap<Uuid, i64>,
        appended: &HashMap<Uuid, i64>,
        warm: &HashSet<Uuid>,
    ) -> anyhow::Result<Self> {
        let histogram = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3);
        let mut legs = Self {
            total: histogram()?,
            relay: histogram()?,
            consumer: histogram()?,
        };
        // Microseconds, at least 1 (the append time has millisecond resolution).
        let span = |from: i64, to: i64| u64::try_from(to - from).unwrap_or(0).max(1);
        for (id, at) in committed {
            if warm.contains(id) {
                continue;
            }
            let Some(done) = consumed.get(id) else {
                bail!("event {id} was not consumed");
            };
            let Some(published) = appended.get(id) else {
                bail!("event {id} is not on the topic");
            };
            legs.total.saturating_record(span(*at, *done));
            legs.relay.saturating_record(span(*at, *published));
            legs.consumer.saturating_record(span(*published, *done));
        }
        Ok(legs)
    }
}
