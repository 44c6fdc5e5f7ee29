//! reparto as one component (`km0 run reparto`), as group member `<instance>-reparto`: the
//! consumer of paid orders, the order saga's assignments on `reparto.comandos`, the relay of
//! its answers to `reparto.eventos`, the periodic assignment of pending deliveries, and the
//! answers to which cities it covers (`reparto.cobertura`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use entrega::rpc::RpcServer;
use entrega::{CancellationToken, TopicRouting};
use futures::FutureExt as _;

use super::{
    CommandConsumer, CoverageAnswers, DeliveryConsumer, DeliveryStore, HttpMaps, LocalMaps, Maps,
    COMMANDS_GROUP, COMMANDS_TOPIC, DELIVERY_AGGREGATE, EVENTS_TOPIC, GROUP, TOPIC,
};
use crate::wiring::{
    consumer_worker, ensure_topics, outbox_relay, run_together, Component, Database, GroupQueue,
    InUp, Start, Started,
};

/// How often reparto looks for free couriers for its pending deliveries.
pub const ASSIGN_EVERY: Duration = Duration::from_millis(500);

/// reparto's database: couriers, deliveries, its outbox and inbox.
pub const DATABASE: Database = Database {
    name: "reparto",
    migrate: |db| Box::pin(async move { DeliveryStore::new(db.clone()).migrate().await }),
    entrega_tables: true,
    outbox: true,
};

/// reparto: see the module.
pub const COMPONENT: Reparto = Reparto;

/// See [`COMPONENT`].
#[derive(Debug, Clone, Copy)]
pub struct Reparto;

#[async_trait]
impl Component for Reparto {
    fn name(&self) -> &'static str {
        "reparto"
    }

    fn about(&self) -> &'static str {
        "The delivery consumer (couriers for paid orders)"
    }

    fn database(&self) -> Option<&'static Database> {
        Some(&DATABASE)
    }

    fn topics(&self) -> &'static [&'static str] {
        &[EVENTS_TOPIC]
    }

    fn groups(&self) -> &'static [GroupQueue] {
        &[
            GroupQueue {
                group: GROUP,
                topic: TOPIC,
                queue: "reparto.pedidos",
            },
            GroupQueue {
                group: COMMANDS_GROUP,
                topic: COMMANDS_TOPIC,
                queue: "reparto.asignaciones",
            },
        ]
    }

    fn in_up(&self) -> InUp {
        InUp::WithSaga
    }

    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let instance = start.components.instance.as_str();
        let store = system
            .reparto()
            .await
            .context("opening the reparto database")?;
        let broker = system.broker().await.context("opening the broker")?;
        ensure_topics(&broker).await?;
        let maps: Arc<dyn Maps> = match &start.components.mapas_url {
            Some(url) => Arc::new(
                HttpMaps::with_builder(url, crate::wiring::tls::client_builder(system.tls_ca())?)
                    .context("the maps service")?,
            ),
            None => Arc::new(LocalMaps),
        };
        spawn_assignment(store.clone(), system.delivery_time(), start.stop.clone());
        let db = store.db().clone();
        let consumer = Arc::new(DeliveryConsumer::new(store.clone(), maps.clone()));
        let member = format!("{instance}-reparto");
        let names = (GROUP, TOPIC, member.clone());
        let paid = consumer_worker(system, &broker, consumer.router(), names, &db);
        let commands = Arc::new(CommandConsumer::new(store.clone(), maps));
        let names = (COMMANDS_GROUP, COMMANDS_TOPIC, format!("{member}-comandos"));
        let commands = consumer_worker(system, &broker, commands.router(), names, &db);
        let routing = TopicRouting::new().route(DELIVERY_AGGREGATE, EVENTS_TOPIC);
        let relay = outbox_relay(
            system,
            (&db, &DATABASE),
            &broker,
            ("reparto", routing),
            &member,
        )?;
        let coverage = RpcServer::new(
            broker.rpc(1),
            Arc::new(CoverageAnswers::new(store.clone())),
            CoverageAnswers::config(),
        );
        tracing::info!(instance, retry = ?system.retry().mode, "reparto started");
        let child = start.stop.child_token();
        let (c1, c2, c3, c4) = (child.clone(), child.clone(), child.clone(), child.clone());
        let task = run_together(
            vec![
                (
                    "reparto consumer",
                    async move { Ok(paid.run(c1).await?) }.boxed(),
                ),
                (
                    "reparto commands",
                    async move { Ok(commands.run(c2).await?) }.boxed(),
                ),
                ("reparto relay", async move { relay.run(c3).await }.boxed()),
                (
                    "reparto coverage",
                    async move { Ok(coverage.run(c4).await?) }.boxed(),
                ),
            ],
            child,
        );
        Ok(Started {
            tasks: vec![("reparto", task)],
            databases: vec![("reparto", db)],
            ..Started::default()
        })
    }
}

/// Every [`ASSIGN_EVERY`] until `stop`: the couriers assigned `delivery_time` ago or more
/// make their deliveries (when they make them by themselves), then pending deliveries get
/// the couriers that are free. A failed round is logged and tried again next time.
fn spawn_assignment(
    store: DeliveryStore,
    delivery_time: Option<Duration>,
    stop: CancellationToken,
) {
    let delivery_ms = delivery_time.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    tokio::spawn(async move {
        loop {
            let now = entrega_core::now_ms();
            if let Some(ms) = delivery_ms {
                match store
                    .complete_assigned_before(now.saturating_sub(ms), now)
                    .await
                {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(delivered = n, "couriers made their deliveries"),
                    Err(e) => tracing::warn!(error = %e, "making due deliveries failed"),
                }
            }
            match store.assign_pending(now).await {
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
