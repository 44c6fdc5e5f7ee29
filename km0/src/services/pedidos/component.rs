//! pedidos' components: its HTTP API (with the order saga's orchestrator when orders run
//! through the saga) and the relay of its outbox.

use anyhow::Context as _;
use async_trait::async_trait;
use futures::FutureExt as _;

use super::{app, routing, OrderStore, PedidosState, SOURCE, TOPIC};
use crate::services::{inventario, pagos, reparto};
use crate::wiring::{
    ensure_topics, outbox_relay, serve_http, Component, Database, GroupQueue, InUp, Start, Started,
};

/// pedidos' database: orders, their lines, the outbox, and the order sagas (their tables
/// whether or not the deployment runs the saga).
pub const DATABASE: Database = Database {
    name: "pedidos",
    migrate: |db| Box::pin(async move { OrderStore::new(db.clone()).migrate().await }),
    entrega_tables: true,
    outbox: true,
};

/// The orders HTTP API, and the order saga's orchestrator when orders run through it.
pub const API: Api = Api;

/// The outbox relay of pedidos.
pub const RELAY: OutboxRelay = OutboxRelay;

/// See [`API`].
#[derive(Debug, Clone, Copy)]
pub struct Api;

/// See [`RELAY`].
#[derive(Debug, Clone, Copy)]
pub struct OutboxRelay;

#[async_trait]
impl Component for Api {
    fn name(&self) -> &'static str {
        "pedidos"
    }

    fn about(&self) -> &'static str {
        "The orders HTTP API (and, with --saga, the order saga's orchestrator)"
    }

    fn database(&self) -> Option<&'static Database> {
        Some(&DATABASE)
    }

    fn groups(&self) -> &'static [GroupQueue] {
        // The orchestrator reads the answers of the saga's steps; on RabbitMQ its queues
        // keep them until it does.
        &[
            GroupQueue {
                group: super::SAGA_GROUP,
                topic: pagos::EVENTS_TOPIC,
                queue: "pedidos.pagos",
            },
            GroupQueue {
                group: super::SAGA_GROUP,
                topic: inventario::EVENTS_TOPIC,
                queue: "pedidos.inventario",
            },
            GroupQueue {
                group: super::SAGA_GROUP,
                topic: reparto::EVENTS_TOPIC,
                queue: "pedidos.reparto",
            },
        ]
    }

    fn uses_broker(&self) -> bool {
        false
    }

    fn serves_http(&self) -> bool {
        true
    }

    fn in_up(&self) -> InUp {
        InUp::Always
    }

    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let store = system
            .pedidos()
            .await
            .context("opening the pedidos database")?;
        let mut started = Started {
            databases: vec![("pedidos", store.db().clone())],
            outbox: Some(store.db().clone()),
            ..Started::default()
        };
        let state = match system.saga() {
            Some(_) => {
                let sagas = system
                    .sagas(&store)
                    .await
                    .context("opening the order sagas")?;
                let task = super::orchestrator::spawn(
                    system,
                    sagas.clone(),
                    &start.components.instance,
                    start.stop.clone(),
                )
                .await?;
                started.tasks.push(("orquestador", task));
                started.sagas = Some(sagas.clone());
                PedidosState::with_sagas(store, sagas)
            }
            None => PedidosState::new(store),
        };
        let state = state.with_coverage(super::Coverage::new(system.clone()));
        let (addr, task) = serve_http(&start, "pedidos", app(state)).await?;
        started.http_addr = Some(addr);
        started.tasks.push(("pedidos", task));
        Ok(started)
    }
}

#[async_trait]
impl Component for OutboxRelay {
    fn name(&self) -> &'static str {
        "relay"
    }

    fn about(&self) -> &'static str {
        "The outbox relay of pedidos"
    }

    fn database(&self) -> Option<&'static Database> {
        Some(&DATABASE)
    }

    fn topics(&self) -> &'static [&'static str] {
        &[
            TOPIC,
            inventario::COMMANDS_TOPIC,
            pagos::COMMANDS_TOPIC,
            reparto::COMMANDS_TOPIC,
        ]
    }

    fn in_up(&self) -> InUp {
        InUp::Always
    }

    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let instance = start.components.instance.as_str();
        let pedidos = system
            .pedidos()
            .await
            .context("opening the pedidos database")?;
        let broker = system.broker().await.context("opening the broker")?;
        ensure_topics(&broker).await?;
        let relay = outbox_relay(
            system,
            (pedidos.db(), &DATABASE),
            &broker,
            (SOURCE, routing()),
            instance,
        )?;
        tracing::info!(instance, "relay started");
        let stats = relay.stats();
        let stop = start.stop.clone();
        let task = tokio::spawn(async move { relay.run(stop).await.context("relay") }.boxed());
        Ok(Started {
            tasks: vec![("relay", task)],
            databases: vec![("pedidos", pedidos.db().clone())],
            outbox: Some(pedidos.db().clone()),
            relay: Some(stats),
            ..Started::default()
        })
    }
}
