//! pagos as tasks: the authorisation server on `pagos.autorizaciones`, the charge consumer on
//! the order events, the order saga's commands on `pagos.comandos`, and the relay of pagos' own outbox to `pagos.eventos`, all in one
//! process (`km0 run pagos`).

use std::sync::Arc;

use anyhow::Context as _;
use entrega::rpc::{RpcServer, StoredAnswers};
use entrega::{CancellationToken, Relay, RelayConfig};
use entrega_core::SystemClock;
use futures::FutureExt as _;

use super::together::run_together;
use super::{ensure_topics, Components, System, Task};
use crate::services::pagos::{
    self, Authoriser, ChargeConsumer, CommandConsumer, Gateway, PaymentStore, AUTHORISER,
    GATEWAY_TIMEOUT,
};
use crate::services::pedidos::PARTITIONS;

/// Where pagos finds the gateway when `--pasarela-url` is not given.
pub const DEFAULT_PASARELA_URL: &str = "http://127.0.0.1:8095";

/// Orders whose commands pagos has at the gateway at once, at least.
const GATEWAY_CONCURRENCY: usize = 8;

/// Longest wait of an idle pagos relay.
const RELAY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Starts pagos' three tasks; the returned task ends when one of them does (its error) or
/// when `stop` is cancelled (after the others finished).
pub(super) async fn spawn_pagos(
    system: &System,
    components: &Components,
    stop: CancellationToken,
) -> anyhow::Result<Task> {
    let store = system.pagos().await.context("opening the pagos database")?;
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topics(&broker).await?;
    let instance = format!("{}-pagos", components.instance);
    let url = components
        .pasarela_url
        .as_deref()
        .unwrap_or(DEFAULT_PASARELA_URL);
    let client = super::tls::client_builder(system.tls_ca())?;
    let gateway =
        Gateway::with_builder(url, GATEWAY_TIMEOUT, client).context("the payment gateway")?;

    let consumer = Arc::new(ChargeConsumer::new(store.clone(), gateway.clone()));
    let names = (pagos::GROUP, pagos::TOPIC, instance.clone());
    let worker =
        super::spawn::consumer_worker(system, &broker, consumer.router(), names, store.db());
    let commands = Arc::new(CommandConsumer::new(store.clone(), gateway));
    let names = (
        pagos::COMMANDS_GROUP,
        pagos::COMMANDS_TOPIC,
        format!("{instance}-comandos"),
    );
    // Each command waits on the gateway: one slow answer must not hold the other orders.
    let commands = super::spawn::consumer_worker_keyed(
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
    let mut rpc = pagos::server_config(store.db());
    rpc.consumer = instance.clone();
    let server = RpcServer::new(broker.rpc(PARTITIONS), handler, rpc);

    let relay = relay_of(system, &store, &broker, &instance);
    tracing::info!(%instance, gateway = %entrega_core::redact_url(url), "pagos started");
    let child = stop.child_token();
    let (c1, c2, c3, c4) = (child.clone(), child.clone(), child.clone(), child.clone());
    Ok(run_together(
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
            (
                "pagos relay",
                async move { Ok(relay.run(c4).await?) }.boxed(),
            ),
        ],
        child,
    ))
}

fn relay_of(
    system: &System,
    store: &PaymentStore,
    broker: &super::Broker,
    instance: &str,
) -> Relay {
    let mut config = RelayConfig::new(pagos::SOURCE, pagos::routing());
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
