//! pagos as one component (`km0 run pagos`): the authorisation server on
//! `pagos.autorizaciones`, the charge consumer on the order events, the order saga's commands
//! on `pagos.comandos`, and the relay of pagos' own outbox to `pagos.eventos`.

use std::sync::Arc;

use anyhow::Context as _;
use async_trait::async_trait;
use entrega::rpc::{RpcServer, StoredAnswers};
use futures::FutureExt as _;

use super::{
    Authoriser, ChargeConsumer, CommandConsumer, Gateway, PaymentStore, AUTHORISER, COMMANDS_GROUP,
    COMMANDS_TOPIC, EVENTS_TOPIC, GATEWAY_TIMEOUT, GROUP, SOURCE, TOPIC,
};
use crate::services::pedidos::PARTITIONS;
use crate::wiring::{
    consumer_worker, consumer_worker_keyed, ensure_topics, outbox_relay, run_together, Component,
    Database, GroupQueue, InUp, Start, Started,
};

/// Where pagos finds the gateway when `--pasarela-url` is not given.
pub const DEFAULT_PASARELA_URL: &str = "http://127.0.0.1:8095";

/// Longest wait at start for the authorisation server's request queue.
const QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Orders whose commands pagos has at the gateway at once, at least.
const GATEWAY_CONCURRENCY: usize = 8;

/// pagos' database: payments, authorisations, its outbox and inbox, stored answers.
pub const DATABASE: Database = Database {
    name: "pagos",
    migrate: |db| Box::pin(async move { PaymentStore::new(db.clone()).migrate().await }),
    entrega_tables: true,
    outbox: true,
};

/// pagos: see the module.
pub const COMPONENT: Pagos = Pagos;

/// See [`COMPONENT`].
#[derive(Debug, Clone, Copy)]
pub struct Pagos;

#[async_trait]
impl Component for Pagos {
    fn name(&self) -> &'static str {
        "pagos"
    }

    fn about(&self) -> &'static str {
        "Card authorisations on `pagos.autorizaciones`, the charge of each order at the \
         gateway (`--pasarela-url`), and pagos' outbox relay"
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
                queue: "pagos.pedidos",
            },
            GroupQueue {
                group: COMMANDS_GROUP,
                topic: COMMANDS_TOPIC,
                queue: "pagos.cobros",
            },
        ]
    }

    fn in_up(&self) -> InUp {
        InUp::WithSaga
    }

    /// Its four tasks; the task ends when one of them does (its error) or when `stop` is
    /// cancelled (after the others finished).
    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let store = system.pagos().await.context("opening the pagos database")?;
        let broker = system.broker().await.context("opening the broker")?;
        ensure_topics(&broker).await?;
        let instance = format!("{}-pagos", start.components.instance);
        let url = start
            .components
            .pasarela_url
            .as_deref()
            .unwrap_or(DEFAULT_PASARELA_URL);
        let client = crate::wiring::tls::client_builder(system.tls_ca())?;
        let gateway =
            Gateway::with_builder(url, GATEWAY_TIMEOUT, client).context("the payment gateway")?;

        let consumer = Arc::new(ChargeConsumer::new(store.clone(), gateway.clone()));
        let names = (GROUP, TOPIC, instance.clone());
        let worker = consumer_worker(system, &broker, consumer.router(), names, store.db());
        let commands = Arc::new(CommandConsumer::new(store.clone(), gateway));
        let names = (
            COMMANDS_GROUP,
            COMMANDS_TOPIC,
            format!("{instance}-comandos"),
        );
        // Each command waits on the gateway: one slow answer must not hold the other orders.
        let commands = consumer_worker_keyed(
            system,
            &broker,
            commands.router(),
            names,
            store.db(),
            system.key_concurrency().max(GATEWAY_CONCURRENCY),
        );

        let handler = Arc::new(StoredAnswers::new(
            store.db().clone(),
            AUTHORISER,
            Authoriser,
        ));
        let mut rpc = super::server_config(store.db());
        rpc.consumer = instance.clone();
        let server = RpcServer::new(broker.rpc(PARTITIONS), handler, rpc);
        let opened = server.opened();

        let relay = outbox_relay(
            system,
            (store.db(), &DATABASE),
            &broker,
            (SOURCE, super::routing()),
            &instance,
        )?;
        tracing::info!(%instance, gateway = %entrega_core::redact_url(url), "pagos started");
        let child = start.stop.child_token();
        let (c1, c2, c3, c4) = (child.clone(), child.clone(), child.clone(), child.clone());
        let task = run_together(
            vec![
                (
                    "pagos charges",
                    async move { Ok(worker.run(c1).await?) }.boxed(),
                ),
                (
                    "pagos commands",
                    async move { Ok(commands.run(c2).await?) }.boxed(),
                ),
                (
                    "pagos authorisations",
                    async move { Ok(server.run(c3).await?) }.boxed(),
                ),
                ("pagos relay", async move { relay.run(c4).await }.boxed()),
            ],
            child,
        );
        // Ready once requests have a queue to land in (a request sent to a queue nobody
        // declared yet is refused), or once pagos has stopped trying.
        tokio::select! {
            () = opened => {}
            () = tokio::time::sleep(QUEUE_WAIT) => {
                tracing::warn!("the authorisation queue is not open yet; pagos goes on starting");
            }
        }
        Ok(Started {
            tasks: vec![("pagos", task)],
            databases: vec![("pagos", store.db().clone())],
            ..Started::default()
        })
    }
}
