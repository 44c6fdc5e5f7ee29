//! inventario as one component (`km0 run inventario`): the stock consumer of
//! `pedido.creado`, the consumer of the order saga's commands on `inventario.comandos`, and
//! the relay of its outbox (`stock.actualizado`, the reservations' answers) to
//! `inventario.eventos`.

use std::sync::Arc;

use anyhow::Context as _;
use async_trait::async_trait;
use entrega::TopicRouting;
use futures::FutureExt as _;

use super::{
    CommandConsumer, StockConsumer, StockStore, COMMANDS_GROUP, COMMANDS_TOPIC, EVENTS_TOPIC,
    GROUP, RESERVATION_AGGREGATE, STOCK_AGGREGATE, TOPIC,
};
use crate::wiring::{
    consumer_worker, ensure_topics, outbox_relay, run_together, spawn_inbox_purge, Component,
    Database, GroupQueue, InUp, Start, Started,
};

/// The producing service of inventario's events (`origen`).
pub const SOURCE: &str = "inventario";

/// inventario's database: the stock, its reservations, its outbox and inbox.
pub const DATABASE: Database = Database {
    name: "inventario",
    migrate: |db| Box::pin(async move { StockStore::new(db.clone()).migrate().await }),
    entrega_tables: true,
    outbox: true,
};

/// inventario: see the module.
pub const COMPONENT: Inventario = Inventario;

/// See [`COMPONENT`].
#[derive(Debug, Clone, Copy)]
pub struct Inventario;

/// Where inventario's relay publishes: stock changes and reservation answers to
/// `inventario.eventos`.
pub fn routing() -> TopicRouting {
    TopicRouting::new()
        .route(STOCK_AGGREGATE, EVENTS_TOPIC)
        .route(RESERVATION_AGGREGATE, EVENTS_TOPIC)
}

#[async_trait]
impl Component for Inventario {
    fn name(&self) -> &'static str {
        "inventario"
    }

    fn about(&self) -> &'static str {
        "The stock consumer, the order saga's reservations, and inventario's outbox relay"
    }

    fn database(&self) -> Option<&'static Database> {
        Some(&DATABASE)
    }

    fn topics(&self) -> &'static [&'static str] {
        &[EVENTS_TOPIC]
    }

    fn groups(&self) -> &'static [GroupQueue] {
        // inventario's orders queue is the seed's `inventario.pedidos` (dead letters in
        // `inventario.pedidos.dlq` through `km0.dlx`).
        &[
            GroupQueue {
                group: GROUP,
                topic: TOPIC,
                queue: "inventario.pedidos",
            },
            GroupQueue {
                group: COMMANDS_GROUP,
                topic: COMMANDS_TOPIC,
                queue: "inventario.reservas",
            },
        ]
    }

    fn in_up(&self) -> InUp {
        InUp::Always
    }

    /// Its three tasks as group member `instance` (`<instance>-reservas` for the commands);
    /// the task ends when one of them does, or after `stop`.
    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let instance = start.components.instance.as_str();
        let stock = system
            .inventario()
            .await
            .context("opening the inventario database")?;
        let broker = system.broker().await.context("opening the broker")?;
        ensure_topics(&broker).await?;
        spawn_inbox_purge(
            stock.db().clone(),
            system.retention().inbox,
            start.stop.clone(),
        );
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
        let relay = outbox_relay(
            system,
            (&db, &DATABASE),
            &broker,
            (SOURCE, routing()),
            instance,
        )?;
        let workers = vec![(GROUP, orders.stats()), (COMMANDS_GROUP, commands.stats())];
        tracing::info!(
            instance,
            key_concurrency = system.key_concurrency(),
            retry = ?system.retry().mode,
            "inventario started"
        );
        let child = start.stop.child_token();
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
                    async move { relay.run(c3).await }.boxed(),
                ),
            ],
            child,
        );
        Ok(Started {
            tasks: vec![("inventario", task)],
            databases: vec![("inventario", db)],
            inventario: Some(stats),
            workers,
            ..Started::default()
        })
    }
}
