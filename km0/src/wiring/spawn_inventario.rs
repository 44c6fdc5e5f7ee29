//! inventario as tasks, in one process (`km0 run inventario`): the stock consumer of
//! `pedido.creado`, the consumer of the order saga's commands on `inventario.comandos`, and
//! the relay of its outbox (`stock.actualizado`, the reservations' answers) to
//! `inventario.eventos`; and catalogo, which reads those events.

use std::sync::Arc;

use anyhow::Context as _;
use entrega::{CancellationToken, Relay, RelayConfig, TopicRouting};
use entrega_core::SystemClock;
use futures::FutureExt as _;

use super::spawn::{consumer_worker, spawn_inbox_purge, RELAY_POLL};
use super::together::run_together;
use super::{ensure_topics, System, Task};
use crate::services::catalogo::{self, CatalogConsumer};
use crate::services::inventario::{
    CommandConsumer, ConsumerStats, StockConsumer, StockStore, COMMANDS_GROUP, COMMANDS_TOPIC,
    EVENTS_TOPIC, GROUP, RESERVATION_AGGREGATE, STOCK_AGGREGATE, TOPIC,
};

/// The producing service of inventario's events (`origen`).
pub const INVENTARIO_SOURCE: &str = "inventario";

/// Where inventario's relay publishes: stock changes and reservation answers to
/// `inventario.eventos`.
pub fn inventario_routing() -> TopicRouting {
    TopicRouting::new()
        .route(STOCK_AGGREGATE, EVENTS_TOPIC)
        .route(RESERVATION_AGGREGATE, EVENTS_TOPIC)
}

/// inventario's three tasks as group member `instance` (`<instance>-reservas` for the
/// commands); the returned task ends when one of them does, or after `stop`.
pub(super) async fn spawn_inventario(
    system: &System,
    instance: &str,
    stop: CancellationToken,
) -> anyhow::Result<(Task, Arc<ConsumerStats>, Vec<GroupStats>)> {
    let stock = system
        .inventario()
        .await
        .context("opening the inventario database")?;
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topics(&broker).await?;
    spawn_inbox_purge(stock.clone(), system.retention().inbox, stop.clone());
    let db = stock.db().clone();
    let consumer = Arc::new(StockConsumer::new(stock.clone()));
    let stats = consumer.stats();
    let names = (GROUP, TOPIC, instance.to_owned());
    let orders = consumer_worker(system, &broker, consumer.router(), names, &db);
    let commands = Arc::new(CommandConsumer::new(stock.clone()));
    let names = (
        COMMANDS_GROUP,
        COMMANDS_TOPIC,
        format!("{instance}-reservas"),
    );
    let commands = consumer_worker(system, &broker, commands.router(), names, &db);
    let relay = relay_of(system, &stock, &broker, instance);
    let groups = vec![(GROUP, orders.stats()), (COMMANDS_GROUP, commands.stats())];
    tracing::info!(
        instance,
        key_concurrency = system.key_concurrency(),
        retry = ?system.retry().mode,
        "inventario started"
    );
    let child = stop.child_token();
    let (c1, c2, c3) = (child.clone(), child.clone(), child.clone());
    let task = run_together(
        vec![
            (
                "inventario consumer",
                async move { Ok(orders.run(c1).await?) }.boxed(),
            ),
            (
                "inventario commands",
                async move { Ok(commands.run(c2).await?) }.boxed(),
            ),
            (
                "inventario relay",
                async move { Ok(relay.run(c3).await?) }.boxed(),
            ),
        ],
        child,
    );
    Ok((task, stats, groups))
}

/// A consumer group's name and its worker's counters.
pub(super) type GroupStats = (&'static str, Arc<entrega::WorkerStats>);

fn relay_of(system: &System, store: &StockStore, broker: &super::Broker, instance: &str) -> Relay {
    let mut config = RelayConfig::new(INVENTARIO_SOURCE, inventario_routing());
    config.instance_id = instance.to_owned();
    config.lease_ttl = system.lease_ttl();
    config.poll_interval = RELAY_POLL;
    config.retention = system.retention().outbox;
    Relay::new(
        store.db().outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        config,
    )
}

/// catalogo's consumer of `inventario.eventos`, as group member `<instance>-catalogo`.
pub(super) async fn spawn_catalogo(
    system: &System,
    instance: &str,
    stop: CancellationToken,
) -> anyhow::Result<Task> {
    let store = system
        .catalogo()
        .await
        .context("opening the catalogo database")?;
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topics(&broker).await?;
    let db = store.db().clone();
    let consumer = Arc::new(CatalogConsumer::new(store));
    let names = (
        catalogo::GROUP,
        catalogo::TOPIC,
        format!("{instance}-catalogo"),
    );
    let worker = consumer_worker(system, &broker, consumer.router(), names, &db);
    tracing::info!(instance, "catalogo started");
    Ok(tokio::spawn(async move {
        worker.run(stop).await.context("catalogo consumer")
    }))
}
