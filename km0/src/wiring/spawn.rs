//! km0's components as tasks: the pedidos outbox relay, the
//! reparto delivery consumer, their periodic chores (purging old processed-message keys,
//! assigning pending deliveries), and analitica's transactional transformer. The two workers
//! take their retry policy from the process's `--retry` flags.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use entrega::{
    CancellationToken, Db, Relay, RelayConfig, RelayStats, Router, TopicRouting, Worker,
    WorkerConfig,
};
use entrega_core::SystemClock;
use entrega_kafka::{KafkaTransformer, TransformerConfig};
use futures::FutureExt as _;

use super::config::RetryMode;
use super::together::run_together;
use super::{ensure_topics, Broker, Components, System, Task};
use crate::services::analitica::{self, SalesTransform};
use crate::services::inventario::StockStore;
use crate::services::pedidos::{routing, PARTITIONS, SOURCE, TOPIC};
use crate::services::reparto::{self, DeliveryConsumer, DeliveryStore, HttpMaps, LocalMaps, Maps};

/// Longest wait of an idle relay for rows committed by other processes (the seed's 0.2 s).
pub(super) const RELAY_POLL: Duration = Duration::from_millis(200);

/// How often reparto looks for free couriers for its pending deliveries.
pub const ASSIGN_EVERY: Duration = Duration::from_millis(500);

/// A worker for `group` on `topic` as `member`, with the process's key concurrency and retry
/// policy; ordered retries park in `db`, the consumer's own database; on RabbitMQ, dead
/// letters and delayed retries use the group's own queues.
pub(super) fn consumer_worker(
    system: &System,
    broker: &Broker,
    router: Router,
    names: (&str, &str, String),
    db: &Db,
) -> Worker {
    consumer_worker_keyed(system, broker, router, names, db, system.key_concurrency())
}

/// [`consumer_worker`] running up to `key_concurrency` keys of a poll at once (one key
/// never runs twice at once, and always in order).
pub(super) fn consumer_worker_keyed(
    system: &System,
    broker: &Broker,
    router: Router,
    (group, topic, member): (&str, &str, String),
    db: &Db,
    key_concurrency: usize,
) -> Worker {
    let mut config = WorkerConfig::new(group, topic).with_key_concurrency(key_concurrency);
    config.member = member;
    config.max_batch = system.max_batch();
    config.replay_key = system.replay_key().cloned();
    system.retry().apply(&mut config);
    config.retry_partitions = PARTITIONS;
    // A dead letter the broker refuses is held in the consumer's own database.
    let mut worker = Worker::new(broker.subscriber(), broker.publisher(), router, config)
        .with_admin(broker.admin())
        .with_held_letters(db.held_letters());
    // RabbitMQ keeps dead letters (and delayed retries) in the group's own queues.
    if let Some(side) = broker.side_queues() {
        worker = worker.with_side_queues(side);
    }
    if system.retry().mode == RetryMode::Ordered {
        worker.with_parking(db.parking())
    } else {
        worker
    }
}

/// reparto as group member `<instance>-reparto`: the consumer of paid orders, the order
/// saga's assignments on `reparto.comandos`, the relay of its answers to `reparto.eventos`,
/// and the periodic assignment of pending deliveries.
pub(super) async fn spawn_reparto(
    system: &System,
    components: &Components,
    stop: CancellationToken,
) -> anyhow::Result<Task> {
    let store = system
        .reparto()
        .await
        .context("opening the reparto database")?;
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topics(&broker).await?;
    let maps: Arc<dyn Maps> = match &components.mapas_url {
        Some(url) => Arc::new(
            HttpMaps::with_builder(url, super::tls::client_builder(system.tls_ca())?)
                .context("the maps service")?,
        ),
        None => Arc::new(LocalMaps),
    };
    spawn_assignment(store.clone(), stop.clone());
    let db = store.db().clone();
    let consumer = Arc::new(DeliveryConsumer::new(store.clone(), maps.clone()));
    let member = format!("{}-reparto", components.instance);
    let names = (reparto::GROUP, reparto::TOPIC, member.clone());
    let paid = consumer_worker(system, &broker, consumer.router(), names, &db);
    let commands = Arc::new(reparto::CommandConsumer::new(store.clone(), maps));
    let names = (
        reparto::COMMANDS_GROUP,
        reparto::COMMANDS_TOPIC,
        format!("{member}-comandos"),
    );
    let commands = consumer_worker(system, &broker, commands.router(), names, &db);
    let mut config = RelayConfig::new(
        "reparto",
        TopicRouting::new().route(reparto::DELIVERY_AGGREGATE, reparto::EVENTS_TOPIC),
    );
    config.instance_id = member;
    config.lease_ttl = system.lease_ttl();
    config.poll_interval = RELAY_POLL;
    config.retention = system.retention().outbox;
    let relay = Relay::new(
        db.outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        config,
    );
    tracing::info!(instance = %components.instance, retry = ?system.retry().mode, "reparto started");
    let child = stop.child_token();
    let (c1, c2, c3) = (child.clone(), child.clone(), child.clone());
    Ok(run_together(
        vec![
            (
                "reparto consumer",
                async move { Ok(paid.run(c1).await?) }.boxed(),
            ),
            (
                "reparto commands",
                async move { Ok(commands.run(c2).await?) }.boxed(),
            ),
            (
                "reparto relay",
                async move { Ok(relay.run(c3).await?) }.boxed(),
            ),
        ],
        child,
    ))
}

/// analitica on Kafka, as group member and transactional id `<instance>-analitica`: sales per
/// market from `pedidos.eventos` to `analitica.ventas`, in Kafka transactions. Refused on the
/// log transport, which has no transactions.
pub(super) async fn spawn_analitica(
    system: &System,
    instance: &str,
    stop: CancellationToken,
) -> anyhow::Result<Task> {
    let broker = system.broker().await.context("opening the broker")?;
    let Some(kafka) = broker.as_kafka() else {
        anyhow::bail!(
            "analitica writes its sales in Kafka transactions: it needs --broker kafka://..., \
             not the {}",
            broker.kind()
        );
    };
    ensure_topics(&broker).await?;
    broker
        .admin()
        .ensure_topic(analitica::OUTPUT_TOPIC, analitica::OUTPUT_PARTITIONS)
        .await
        .with_context(|| format!("creating topic {}", analitica::OUTPUT_TOPIC))?;
    let name = format!("{instance}-analitica");
    let config = TransformerConfig::new(analitica::GROUP, name.clone(), name, &[TOPIC]);
    let transformer = KafkaTransformer::start(kafka.config(), config)
        .await
        .context("starting analitica's transactional clients")?;
    tracing::info!(instance, "analitica started");
    let replay_key = system.replay_key().cloned();
    Ok(tokio::spawn(async move {
        let transform = SalesTransform::new(TOPIC).with_replay_key(replay_key);
        transformer
            .run(&transform, stop.cancelled_owned())
            .await
            .map(drop)
            .context("analitica")
    }))
}

/// Gives pending deliveries the couriers that became free, every [`ASSIGN_EVERY`], until
/// `stop`. A failed round is logged and tried again next time.
fn spawn_assignment(store: DeliveryStore, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            match store.assign_pending(entrega_core::now_ms()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(assigned = n, "pending deliveries assigned"),
                Err(e) => tracing::warn!(error = %e, "assigning pending deliveries failed"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ASSIGN_EVERY) => {}
            }
        }
    });
}

/// Deletes processed-message keys older than `retention`, now and then, until `stop`.
/// A failed purge is logged and tried again next time: keys kept longer are harmless.
pub(super) fn spawn_inbox_purge(stock: StockStore, retention: Duration, stop: CancellationToken) {
    let every = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    tokio::spawn(async move {
        loop {
            match stock.purge_keys(retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "old processed-message keys purged"),
                Err(e) => tracing::warn!(error = %e, "purging processed-message keys failed"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    });
}

/// The outbox relay of pedidos, publishing to the broker, as lane owner `instance`.
pub(super) async fn spawn_relay(
    system: &System,
    instance: &str,
    stop: CancellationToken,
) -> anyhow::Result<(Task, Arc<RelayStats>)> {
    let pedidos = system
        .pedidos()
        .await
        .context("opening the pedidos database")?;
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topics(&broker).await?;
    let mut config = RelayConfig::new(SOURCE, routing());
    config.instance_id = instance.to_owned();
    config.lease_ttl = system.lease_ttl();
    config.poll_interval = RELAY_POLL;
    config.retention = system.retention().outbox;
    let relay = Relay::new(
        pedidos.db().outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        config,
    );
    tracing::info!(instance, "relay started");
    let stats = relay.stats();
    let task = tokio::spawn(async move { relay.run(stop).await.context("relay") });
    Ok((task, stats))
}
