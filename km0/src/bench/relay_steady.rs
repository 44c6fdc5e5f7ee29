//! `km0 bench relay --steady-rate R`: each source of the relay at a steady rate of single-row
//! transactions, as a service writes them: the time from each commit returning to the
//! broker's confirmation of its event, and the CPU the relay and PostgreSQL spent per 100,000
//! events (from `/proc`; the bench process holds the writer too, which is the same for both
//! sources).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use async_trait::async_trait;
use entrega::{CancellationToken, Relay, RelayConfig, SystemClock, TopicRouting};
use entrega_core::headers::ID_EVENTO;
use entrega_core::{OutgoingMessage, Publisher, TransportError};
use hdrhistogram::Histogram;
use uuid::Uuid;

use super::arrivals::now_us;
use super::cpu::CpuSampler;
use super::relay_wal::{make_slot, wal_relay};
use super::workload::outbox_events;
use super::{progress, BenchRun};
use crate::services::pedidos::{AGGREGATE, SOURCE};
use crate::wiring::ensure_topic_and_dlq;
use crate::wiring::relay::RelaySource;
use entrega::Db;

/// What one steady run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steady {
    /// Commit to broker confirmation, p50, in ms.
    pub(crate) p50_ms: f64,
    /// The same, p99.
    pub(crate) p99_ms: f64,
    /// CPU seconds of the bench process and PostgreSQL per 100,000 events.
    pub(crate) cpu_s_per_100k: f64,
    /// Of which PostgreSQL's.
    pub(crate) postgres_s_per_100k: f64,
}

/// Notes when the broker confirmed each event.
struct Acks {
    inner: Arc<dyn Publisher>,
    at: Mutex<HashMap<Uuid, i64>>,
}

#[async_trait]
impl Publisher for Acks {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        self.inner.publish(batch).await?;
        let now = now_us();
        let mut at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        for m in batch {
            if let Some(id) = m
                .headers
                .get(ID_EVENTO)
                .and_then(|v| Uuid::parse_str(v).ok())
            {
                at.entry(id).or_insert(now);
            }
        }
        Ok(())
    }
}

/// One steady run of `source` at `rate` rows/s for `seconds` (after a second of warm-up);
/// with no source, the writer alone (no relay runs, nothing is published: its CPU is what the
/// sources' runs spend besides the relay).
pub(crate) async fn measure(
    run: &BenchRun,
    source: Option<RelaySource>,
    rate: u32,
    seconds: u64,
) -> anyhow::Result<Steady> {
    let pedidos = run.system.pedidos().await.context("opening pedidos")?;
    let broker = run.system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, &run.topic).await?;
    let acks = Arc::new(Acks {
        inner: broker.publisher(),
        at: Mutex::default(),
    });
    let result = steady(
        run,
        pedidos.db(),
        Arc::clone(&acks),
        source,
        (rate, seconds),
    )
    .await;
    pedidos.db().close().await;
    broker.close().await;
    result
}

async fn steady(
    run: &BenchRun,
    db: &Db,
    acks: Arc<Acks>,
    source: Option<RelaySource>,
    (rate, seconds): (u32, u64),
) -> anyhow::Result<Steady> {
    let stop = CancellationToken::new();
    let task = match source {
        None => tokio::spawn(async { Ok::<_, anyhow::Error>(()) }),
        Some(RelaySource::Poll) => {
            let mut config =
                RelayConfig::new(SOURCE, TopicRouting::new().route(AGGREGATE, &run.topic));
            config.poll_interval = crate::wiring::RELAY_POLL;
            let relay = Relay::new(db.outbox(), acks.clone(), Arc::new(SystemClock), config);
            let stop = stop.clone();
            tokio::spawn(async move { Ok::<_, anyhow::Error>(relay.run(stop).await?) })
        }
        Some(RelaySource::Wal) => {
            let relay = wal_relay(run, db, acks.clone(), 100)?;
            make_slot(&relay).await?;
            let stop = stop.clone();
            tokio::spawn(async move { Ok::<_, anyhow::Error>(relay.run(stop).await?) })
        }
    };
    let rate = rate.max(1);
    let warmup = rate as usize;
    let measured = rate as usize * seconds as usize;
    let events = outbox_events(warmup + measured, 10_000)?;
    let committed: Arc<Mutex<HashMap<Uuid, i64>>> = Arc::default();
    let every = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now();
    let mut cpu = None;
    let mut writers = Vec::with_capacity(events.len());
    let mut measured_from = Instant::now();
    for (i, event) in events.iter().enumerate() {
        if i == warmup {
            cpu = Some(CpuSampler::start());
            measured_from = Instant::now();
        }
        // Each arrival at its own time, in its own task: a slow commit does not delay the next.
        tokio::time::sleep_until(start + every * u32::try_from(i)?).await;
        let (db, event, committed) = (db.clone(), event.clone(), Arc::clone(&committed));
        let counted = i >= warmup;
        writers.push(tokio::spawn(async move {
            let mut tx = db.begin().await?;
            tx.enqueue(&event).await?;
            tx.commit().await?;
            if counted {
                committed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(event.id, now_us());
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for writer in writers {
        writer.await.context("writer task")??;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while source.is_some() {
        let done = {
            let at = acks.at.lock().unwrap_or_else(PoisonError::into_inner);
            events.iter().all(|e| at.contains_key(&e.id))
        };
        if done {
            break;
        }
        if Instant::now() >= deadline {
            bail!("events still unpublished a minute after the last commit");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let window = measured_from.elapsed().as_secs_f64();
    let used = match cpu {
        Some(sampler) => sampler.stop().await,
        None => bail!("no measured arrivals"),
    };
    stop.cancel();
    task.await.context("relay task")??;
    let mut histogram = Histogram::<u64>::new(3)?;
    let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
    let at = acks.at.lock().unwrap_or_else(PoisonError::into_inner);
    for (id, commit) in committed.iter() {
        if let Some(ack) = at.get(id) {
            histogram.record(u64::try_from((ack - commit).max(1))?)?;
        }
    }
    let per_100k = |percent: f64| percent / 100.0 * window / measured as f64 * 100_000.0;
    let steady = Steady {
        p50_ms: histogram.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1000.0,
        cpu_s_per_100k: per_100k(used.of("postgres") + used.of("km0")),
        postgres_s_per_100k: per_100k(used.of("postgres")),
    };
    progress(format!(
        "{} at {rate}/s: p50 {:.1} ms, p99 {:.1} ms, {:.1} CPU s per 100k events ({:.1} of \
         them PostgreSQL's)",
        source.map_or("the writer alone", RelaySource::name),
        steady.p50_ms,
        steady.p99_ms,
        steady.cpu_s_per_100k,
        steady.postgres_s_per_100k
    ));
    Ok(steady)
}
