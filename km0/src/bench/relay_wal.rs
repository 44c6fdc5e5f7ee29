//! The WAL relay in `km0 bench relay`: draining a backlog that waits in the WAL (the slot
//! made first, the rows written after it), with the same rows and broker as the polling relay.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use entrega::{CancellationToken, RelayConfig, TopicRouting, WalConfig, WalRelay};
use entrega_core::{now_ms, Publisher};

use super::pgbench::rate;
use super::relay::{all_published, wait_published, Drained, RelayArgs};
use super::timed_publisher::TimedPublisher;
use super::workload::{outbox_events, prefill_outbox};
use super::BenchRun;
use crate::services::pedidos::{self, AGGREGATE, SOURCE};
use crate::wiring::{ensure_topic_and_dlq, Broker};
use entrega::Db;

/// A WAL relay of `pedidos`' outbox in `run`, publishing to `run.topic` through `publisher`.
pub(crate) fn wal_relay(
    run: &BenchRun,
    pedidos: &Db,
    publisher: Arc<dyn Publisher>,
    batch: usize,
) -> anyhow::Result<Arc<WalRelay>> {
    let mut config = RelayConfig::new(SOURCE, TopicRouting::new().route(AGGREGATE, &run.topic));
    config.batch_size = batch.max(1);
    let url = run.system.databases().existing_url(&pedidos::DATABASE);
    Ok(Arc::new(WalRelay::new(
        url,
        pedidos,
        publisher,
        config,
        WalConfig::default(),
    )?))
}

/// Runs `relay` until it streams from its slot (creating it), then stops it.
pub(crate) async fn make_slot(relay: &Arc<WalRelay>) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (relay, stop) = (Arc::clone(relay), stop.clone());
        async move { relay.run(stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !relay.gauges().streaming() {
        if task.is_finished() || Instant::now() >= deadline {
            stop.cancel();
            task.await.context("WAL relay task")??;
            bail!("the WAL relay did not start streaming");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    task.await.context("WAL relay task")??;
    Ok(())
}

/// One backlog drain by the WAL relay on fresh databases.
pub(crate) async fn drain(run: &BenchRun, args: &RelayArgs) -> anyhow::Result<Drained> {
    let pedidos = run.system.pedidos().await.context("opening pedidos")?;
    let broker = run.system.broker().await.context("opening the broker")?;
    ensure_topic_and_dlq(&broker, &run.topic).await?;
    let result = drain_in(run, pedidos.db(), &broker, args).await;
    pedidos.db().close().await;
    broker.close().await;
    result
}

async fn drain_in(
    run: &BenchRun,
    pedidos: &Db,
    broker: &Broker,
    args: &RelayArgs,
) -> anyhow::Result<Drained> {
    let busy_us = Arc::new(AtomicU64::new(0));
    let publisher: Arc<dyn Publisher> = Arc::new(TimedPublisher::new(
        broker.publisher(),
        Arc::clone(&busy_us),
    ));
    let relay = wal_relay(run, pedidos, Arc::clone(&publisher), args.batch)?;
    make_slot(&relay).await?;
    // Written after the slot: the backlog is in the WAL, read from the stream.
    prefill_outbox(pedidos, &outbox_events(args.events, args.aggregates)?).await?;
    let relay = wal_relay(run, pedidos, publisher, args.batch)?;
    let stop = CancellationToken::new();
    let start_ms = now_ms();
    let started = Instant::now();
    let task = tokio::spawn({
        let (relay, stop) = (Arc::clone(&relay), stop.clone());
        async move { relay.run(stop).await }
    });
    let drained = wait_published(
        "relay wal",
        args,
        || relay.stats().published(),
        || task.is_finished(),
    )
    .await;
    let drain_us = started.elapsed().as_micros() as f64;
    stop.cancel();
    task.await.context("WAL relay task")??;
    drained?;
    let end_ms = all_published(run, pedidos, broker, args).await?;
    let busy = busy_us.load(std::sync::atomic::Ordering::Relaxed) as f64;
    Ok(Drained {
        rate: rate(args.events, start_ms, end_ms),
        publish_percent: 100.0 * busy / drain_us.max(1.0),
        read_percent: 0.0,
        mark_percent: 0.0,
    })
}
