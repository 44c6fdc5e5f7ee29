//! `km0 bench poison`: what one always-failing message does to the latency of the healthy
//! messages of its partition, under each retry strategy.
//!
//! A one-partition topic receives healthy events at a fixed rate over 50 keys; a quarter of
//! the way in, one event of key `envenenado` arrives whose handler always fails transiently.
//! The handler does no other work, so what is measured is the engine: how long healthy
//! events wait (from their envelope's `fecha_ms` to the handler) while the poison is retried
//! and finally dead-lettered. Configurations: no poison (the baseline), retries in place,
//! through the retry topic, and ordered (the key parked in the consumer's database).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use async_trait::async_trait;
use clap::Args;
use entrega::{
    Backoff, CancellationToken, Handler, Message, RetryStrategy, Router, Worker, WorkerConfig,
};
use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{now_ms, Envelope, HandlerError, Headers, OutgoingMessage};
use serde_json::json;

use super::report::{BenchReport, Measurement};
use super::{progress, BenchRun, Common};

/// The key whose event always fails.
const POISON_KEY: &str = "envenenado";
/// Keys of the healthy events.
const KEYS: u32 = 50;

/// `km0 bench poison`.
#[derive(Debug, Clone, Args)]
pub struct PoisonArgs {
    /// Healthy events per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Seconds of arrivals per measurement.
    #[arg(long, default_value_t = 8)]
    pub duration: u64,
    /// Attempts of the poison before it is dead-lettered.
    #[arg(long, default_value_t = 4)]
    pub max_attempts: u32,
    /// Delay after the first failure, in milliseconds; doubles with each attempt.
    #[arg(long, default_value_t = 250)]
    pub retry_base_ms: u64,
}

/// The configurations measured, in report order.
const CONFIGS: [(&str, Option<RetryStrategy>); 4] = [
    ("no poison", None),
    ("in place", Some(RetryStrategy::InPlace)),
    ("retry topic", Some(RetryStrategy::RetryTopic)),
    ("ordered", Some(RetryStrategy::Ordered)),
];

#[derive(Debug, thiserror::Error)]
#[error("this message always fails")]
struct Poisoned;

/// Records each healthy event's latency; fails the poison every time.
#[derive(Default)]
struct Probe {
    /// (`fecha_ms` of the event, latency in ms).
    seen: Mutex<Vec<(i64, i64)>>,
    poison_attempts: AtomicU64,
}

#[async_trait]
impl Handler for Probe {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        if msg.key.as_deref() == Some(POISON_KEY) {
            self.poison_attempts.fetch_add(1, Ordering::Relaxed);
            return Err(HandlerError::transient(Poisoned));
        }
        let at = msg.envelope.timestamp_ms;
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.push((at, now_ms() - at));
        Ok(())
    }
}

/// What one measurement saw.
struct Outcome {
    p50: f64,
    p99: f64,
    max: f64,
    /// p99 of the healthy events created while the poison was being retried.
    p99_during: f64,
    /// From the poison's creation to its dead letter, in seconds.
    to_dlq_s: f64,
    attempts: u64,
}

fn percentile(sorted: &[i64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

fn message(topic: &str, key: &str, n: u64) -> OutgoingMessage {
    let envelope = Envelope::new("pedido.creado", "bench", json!({ "n": n }));
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        headers: Headers::new()
            .with(TIPO, envelope.kind.clone())
            .with(ID_EVENTO, envelope.id.to_string()),
        payload: envelope.to_bytes(),
    }
}

async fn measure(
    run: &BenchRun,
    args: &PoisonArgs,
    strategy: Option<RetryStrategy>,
) -> anyhow::Result<Outcome> {
    let broker = run.system.broker().await.context("opening the broker")?;
    let admin = broker.admin();
    let (dlq, retry) = (format!("{}.dlq", run.topic), format!("{}.retry", run.topic));
    for topic in [&run.topic, &dlq, &retry] {
        admin.ensure_topic(topic, 1).await?;
    }
    let stock = run.system.inventario().await?;
    let probe = Arc::new(Probe::default());
    let mut config = WorkerConfig::new(&run.group, &run.topic)
        .with_retry(strategy.unwrap_or(RetryStrategy::InPlace));
    config.max_attempts = args.max_attempts.max(1);
    let base = Duration::from_millis(args.retry_base_ms);
    config.backoff = Backoff::new(base, base * 16).with_jitter(0.0);
    config.poll_wait = Duration::from_millis(100);
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        Router::new().route("pedido.creado", probe.clone() as Arc<dyn Handler>),
        config,
    )
    .with_admin(admin)
    .with_parking(stock.db().parking());
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });

    let publisher = broker.publisher();
    // The measurement starts once the worker holds the partition (a Kafka group join takes
    // seconds): one warm-up event, consumed and then forgotten.
    publisher
        .publish(&[message(&run.topic, "calentamiento", 0)])
        .await?;
    let joined = Instant::now() + Duration::from_secs(60);
    while probe
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_empty()
    {
        if Instant::now() > joined {
            bail!("the worker did not consume the warm-up event within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    probe
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
    let total = u64::from(args.rate) * args.duration;
    let every = Duration::from_secs(1) / args.rate.max(1);
    let poison_at = total / 4;
    let mut poison_ms = None;
    let start = Instant::now();
    for n in 0..total {
        tokio::time::sleep_until((start + every * n as u32).into()).await;
        if n == poison_at && strategy.is_some() {
            let poison = message(&run.topic, POISON_KEY, n);
            poison_ms = Some(now_ms());
            publisher.publish(&[poison]).await?;
        }
        let key = format!("K-{}", n % u64::from(KEYS));
        publisher.publish(&[message(&run.topic, &key, n)]).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let dead_at = loop {
        let seen = probe
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
        let dead = if poison_ms.is_some() {
            broker
                .read(&dlq, 0, 0, 1)
                .await?
                .first()
                .map(|r| r.timestamp_ms)
        } else {
            Some(0)
        };
        if let (true, Some(at)) = (seen >= total, dead) {
            break at;
        }
        if Instant::now() > deadline {
            bail!("{seen} of {total} healthy events handled, poison dead: {dead:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.cancel();
    task.await.context("worker task")??;
    stock.db().close().await;
    broker.close().await;

    let seen = probe
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut all: Vec<i64> = seen.iter().map(|(_, l)| *l).collect();
    all.sort_unstable();
    let mut during: Vec<i64> = match poison_ms {
        Some(from) => seen
            .iter()
            .filter(|(at, _)| *at >= from && *at <= dead_at)
            .map(|(_, l)| *l)
            .collect(),
        None => all.clone(),
    };
    during.sort_unstable();
    Ok(Outcome {
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
        max: all.last().copied().unwrap_or(0) as f64,
        p99_during: percentile(&during, 0.99),
        to_dlq_s: poison_ms.map_or(0.0, |p| (dead_at - p) as f64 / 1000.0),
        attempts: probe.poison_attempts.load(Ordering::Relaxed),
    })
}

/// Runs every configuration `--runs` times and reports the healthy events' latencies.
pub(crate) async fn run(common: &Common, args: &PoisonArgs) -> anyhow::Result<BenchReport> {
    let mut rows = Vec::new();
    for (name, strategy) in CONFIGS {
        let mut outcomes = Vec::new();
        for i in 0..common.runs {
            let run = common.place.fresh();
            let outcome = measure(&run, args, strategy).await;
            common.cleanup(&run).await?;
            let o = outcome?;
            progress(format_args!(
                "{name} run {}: p50 {} ms, p99 {} ms, p99 while retried {} ms, to DLQ {:.2} s, {} attempts",
                i + 1, o.p50, o.p99, o.p99_during, o.to_dlq_s, o.attempts
            ));
            outcomes.push(o);
        }
        let col = |f: fn(&Outcome) -> f64| outcomes.iter().map(f).collect::<Vec<f64>>();
        rows.push(Measurement::new(
            format!("{name}: healthy p50"),
            "ms",
            col(|o| o.p50),
        ));
        rows.push(Measurement::new(
            format!("{name}: healthy p99"),
            "ms",
            col(|o| o.p99),
        ));
        rows.push(Measurement::new(
            format!("{name}: healthy max"),
            "ms",
            col(|o| o.max),
        ));
        if strategy.is_some() {
            rows.push(Measurement::new(
                format!("{name}: healthy p99 while the poison is retried"),
                "ms",
                col(|o| o.p99_during),
            ));
            rows.push(Measurement::new(
                format!("{name}: poison to dead letter"),
                "s",
                col(|o| o.to_dlq_s),
            ));
        }
    }
    Ok(BenchReport {
        bench: "poison".into(),
        backend: common.place.backend().into(),
        setup: format!(
            "{} healthy events/s for {} s over {KEYS} keys on one partition; one poison \
             (always transient) at a quarter; {} attempts, backoff from {} ms",
            args.rate, args.duration, args.max_attempts, args.retry_base_ms
        ),
        settings: serde_json::to_value(json!({
            "rate": args.rate, "duration_s": args.duration,
            "max_attempts": args.max_attempts, "retry_base_ms": args.retry_base_ms,
        }))?,
        rows,
    })
}
