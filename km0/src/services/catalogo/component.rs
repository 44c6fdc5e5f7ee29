//! catalogo as one component (`km0 run catalogo`): the consumer of `inventario.eventos` that
//! keeps the low-stock flags, as group member `<instance>-catalogo`.

use std::sync::Arc;

use anyhow::Context as _;
use async_trait::async_trait;

use super::{CatalogConsumer, CatalogStore, GROUP, TOPIC};
use crate::wiring::{
    consumer_worker, ensure_topics, Component, Database, GroupQueue, InUp, Start, Started,
};

/// catalogo's database: the low-stock flags and its inbox.
pub const DATABASE: Database = Database {
    name: "catalogo",
    migrate: |db| Box::pin(async move { CatalogStore::new(db.clone()).migrate().await }),
    entrega_tables: true,
    outbox: false,
};

/// catalogo: see the module.
pub const COMPONENT: Catalogo = Catalogo;

/// See [`COMPONENT`].
#[derive(Debug, Clone, Copy)]
pub struct Catalogo;

#[async_trait]
impl Component for Catalogo {
    fn name(&self) -> &'static str {
        "catalogo"
    }

    fn about(&self) -> &'static str {
        "The catalogue's low-stock flags, from inventario's `stock.actualizado`"
    }

    fn database(&self) -> Option<&'static Database> {
        Some(&DATABASE)
    }

    fn groups(&self) -> &'static [GroupQueue] {
        &[GroupQueue {
            group: GROUP,
            topic: TOPIC,
            queue: "catalogo.stock",
        }]
    }

    fn in_up(&self) -> InUp {
        InUp::Always
    }

    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let instance = start.components.instance.as_str();
        let store = system
            .catalogo()
            .await
            .context("opening the catalogo database")?;
        let broker = system.broker().await.context("opening the broker")?;
        ensure_topics(&broker).await?;
        let db = store.db().clone();
        let consumer = Arc::new(CatalogConsumer::new(store));
        let names = (GROUP, TOPIC, format!("{instance}-catalogo"));
        let worker = consumer_worker(system, &broker, consumer.router(), names, &db);
        tracing::info!(instance, "catalogo started");
        let stop = start.stop.clone();
        let task = tokio::spawn(async move { worker.run(stop).await.context("catalogo consumer") });
        Ok(Started {
            tasks: vec![("catalogo", task)],
            databases: vec![("catalogo", db)],
            ..Started::default()
        })
    }
}
