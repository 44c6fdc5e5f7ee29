//! Starting km0's components for a deployment: the pedidos HTTP API, the outbox relay, the
//! inventario consumer, the reparto consumer and analitica, in any combination, in this
//! process.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use entrega::CancellationToken;

use super::ops_server::{self, OpsSources};
use super::spawn::{spawn_analitica, spawn_relay, spawn_reparto};
use super::{System, Task};
use crate::services::inventario::ConsumerStats;
use crate::services::pasarela::{self, Faults, PasarelaState};
use crate::services::pedidos::{app, PedidosState};

/// Which components to start, and the instance name they use among their peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Components {
    /// The pedidos HTTP API.
    pub pedidos: bool,
    /// The outbox relay.
    pub relay: bool,
    /// The inventario consumer.
    pub inventario: bool,
    /// The reparto consumer and its periodic assignment of pending deliveries.
    pub reparto: bool,
    /// catalogo: the low-stock flags, from inventario's `stock.actualizado`.
    pub catalogo: bool,
    /// reparto's maps service; `None` computes routes in-process.
    pub mapas_url: Option<String>,
    /// analitica: sales per market in Kafka transactions (Kafka brokers only).
    pub analitica: bool,
    /// The payment gateway simulator (its HTTP API on the process's address), with the
    /// faults of this run.
    pub pasarela: Option<Faults>,
    /// pagos: card authorisations, the charge of each order, and its outbox relay.
    pub pagos: bool,
    /// The gateway pagos charges through; `None` is [`super::DEFAULT_PASARELA_URL`].
    pub pasarela_url: Option<String>,
    /// Relay lane owner and consumer group member name.
    pub instance: String,
    /// Where to serve `/metrics`, `/healthz` and `/readyz`; `None` serves nothing.
    pub ops: Option<SocketAddr>,
    /// Serve the web console on the operations endpoint, with these operators allowed to act.
    pub console: Option<crate::console::Operators>,
}

impl Components {
    /// Everything, as `km0 up` and `km0 demo` run it.
    pub fn all(instance: &str) -> Self {
        Self {
            pedidos: true,
            relay: true,
            inventario: true,
            reparto: false,
            catalogo: true,
            mapas_url: None,
            analitica: false,
            pasarela: None,
            pagos: false,
            pasarela_url: None,
            instance: instance.to_owned(),
            ops: None,
            console: None,
        }
    }

    /// Nothing yet; switch components on field by field.
    pub fn none(instance: &str) -> Self {
        Self {
            pedidos: false,
            relay: false,
            inventario: false,
            reparto: false,
            catalogo: false,
            mapas_url: None,
            analitica: false,
            pasarela: None,
            pagos: false,
            pasarela_url: None,
            instance: instance.to_owned(),
            ops: None,
            console: None,
        }
    }
}

/// Components running in this process.
pub struct Running {
    stop: CancellationToken,
    tasks: Vec<(&'static str, Task)>,
    http_addr: Option<SocketAddr>,
    ops_addr: Option<SocketAddr>,
    consumer_stats: Option<Arc<ConsumerStats>>,
}

impl Running {
    /// Where the HTTP API listens, if it runs.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Where the operations endpoint listens, if it is served.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops_addr
    }

    /// The consumer's counters, if it runs.
    pub fn consumer_stats(&self) -> Option<Arc<ConsumerStats>> {
        self.consumer_stats.clone()
    }

    /// A token that stops every component when cancelled.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Waits until a component ends by itself (an error) or the stop token is cancelled, then
    /// stops the rest and waits for them.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let first = {
            let stop = self.stop.clone();
            let any_task = futures::future::select_all(self.tasks.iter_mut().map(|(_, t)| t));
            tokio::select! {
                biased;
                () = stop.cancelled() => None,
                (result, index, _) = any_task => Some((index, result)),
            }
        };
        let mut outcome = Ok(());
        if let Some((index, result)) = first {
            let (name, _) = self.tasks.remove(index);
            outcome = flatten(name, result);
            // Components end by themselves only when stopping; otherwise it is a failure.
            if outcome.is_ok() && !self.stop.is_cancelled() {
                outcome = Err(anyhow::anyhow!("{name} stopped unexpectedly"));
            }
        }
        let rest = self.shutdown().await;
        outcome.and(rest)
    }

    /// Stops every component and waits for each to finish cleanly.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown().await
    }

    async fn shutdown(self) -> anyhow::Result<()> {
        self.stop.cancel();
        let mut outcome = Ok(());
        for (name, task) in self.tasks {
            let result = flatten(name, task.await);
            if outcome.is_ok() {
                outcome = result;
            }
        }
        outcome
    }
}

fn flatten(
    name: &str,
    joined: Result<anyhow::Result<()>, tokio::task::JoinError>,
) -> anyhow::Result<()> {
    match joined {
        Ok(result) => result.with_context(|| format!("{name} failed")),
        Err(e) => Err(anyhow::anyhow!("{name} crashed: {e}")),
    }
}

impl System {
    /// Starts `components`; the HTTP API binds `http` (port 0 picks a free one).
    pub async fn start(&self, components: Components, http: SocketAddr) -> anyhow::Result<Running> {
        let stop = CancellationToken::new();
        let mut running = Running {
            stop: stop.clone(),
            tasks: Vec::new(),
            http_addr: None,
            ops_addr: None,
            consumer_stats: None,
        };
        if components.ops.is_some() {
            ops_server::recorder();
        }
        let mut relay_stats = None;
        let mut saga_store = None;
        let mut worker_stats = Vec::new();
        if components.pedidos {
            let store = self
                .pedidos()
                .await
                .context("opening the pedidos database")?;
            let listener = tokio::net::TcpListener::bind(http)
                .await
                .with_context(|| format!("binding {http}"))?;
            let addr = listener.local_addr()?;
            tracing::info!(%addr, "pedidos listening");
            running.http_addr = Some(addr);
            let state = match self.saga() {
                Some(_) => {
                    let sagas = self
                        .sagas(&store)
                        .await
                        .context("opening the order sagas")?;
                    let task = super::spawn_saga::spawn_orchestrator(
                        self,
                        sagas.clone(),
                        &components.instance,
                        stop.clone(),
                    )
                    .await?;
                    running.tasks.push(("orquestador", task));
                    saga_store = Some(sagas.clone());
                    PedidosState::with_sagas(store, sagas)
                }
                None => PedidosState::new(store),
            };
            let limits = self.http_limits();
            let task = tokio::spawn(super::http_server::serve(
                listener,
                app(state),
                limits,
                self.http_tls()?,
                stop.clone(),
            ));
            running.tasks.push(("pedidos", task));
        }
        if let Some(faults) = &components.pasarela {
            anyhow::ensure!(
                !components.pedidos,
                "pedidos and pasarela each serve HTTP: run them in separate processes"
            );
            let ledger = self
                .pasarela()
                .await
                .context("opening the pasarela ledger")?;
            let listener = tokio::net::TcpListener::bind(http)
                .await
                .with_context(|| format!("binding {http}"))?;
            let addr = listener.local_addr()?;
            tracing::info!(%addr, "pasarela listening");
            running.http_addr = Some(addr);
            let state = PasarelaState::new(ledger, faults.clone());
            let limits = self.http_limits();
            let task = tokio::spawn(super::http_server::serve(
                listener,
                pasarela::app(state),
                limits,
                self.http_tls()?,
                stop.clone(),
            ));
            running.tasks.push(("pasarela", task));
        }
        if components.relay {
            let (task, stats) = spawn_relay(self, &components.instance, stop.clone()).await?;
            relay_stats = Some(stats);
            running.tasks.push(("relay", task));
        }
        if components.inventario {
            let (task, stats, groups) =
                super::spawn_inventario::spawn_inventario(self, &components.instance, stop.clone())
                    .await?;
            running.consumer_stats = Some(stats);
            worker_stats.extend(groups);
            running.tasks.push(("inventario", task));
        }
        if components.catalogo {
            let task =
                super::spawn_inventario::spawn_catalogo(self, &components.instance, stop.clone())
                    .await?;
            running.tasks.push(("catalogo", task));
        }
        if components.reparto {
            let task = spawn_reparto(self, &components, stop.clone()).await?;
            running.tasks.push(("reparto", task));
        }
        if components.pagos {
            let task = super::spawn_pagos::spawn_pagos(self, &components, stop.clone()).await?;
            running.tasks.push(("pagos", task));
        }
        if components.analitica {
            let task = spawn_analitica(self, &components.instance, stop.clone()).await?;
            running.tasks.push(("analitica", task));
        }
        if let Some(addr) = components.ops {
            let mut sources = self.ops_sources(&components).await?;
            sources.relay = relay_stats;
            sources.inventario = running.consumer_stats.clone();
            sources.workers = worker_stats;
            sources.sagas = saga_store;
            let console = match &components.console {
                Some(operators) => {
                    Some(crate::console::router(self.clone(), operators.clone()).await?)
                }
                None => None,
            };
            let (bound, task) = ops_server::serve(
                addr,
                sources,
                console,
                self.http_limits(),
                self.http_tls()?,
                stop.clone(),
            )
            .await?;
            tracing::info!(addr = %bound, "operations endpoint listening");
            running.ops_addr = Some(bound);
            running.tasks.push(("ops", task));
        }
        Ok(running)
    }

    /// The databases and the broker `components` use, for the operations endpoint.
    async fn ops_sources(&self, components: &Components) -> anyhow::Result<OpsSources> {
        let mut sources = OpsSources::default();
        if components.pedidos || components.relay {
            let db = self.pedidos().await?.db().clone();
            sources.outbox = Some(db.clone());
            sources.databases.push(("pedidos", db));
        }
        if components.inventario {
            sources
                .databases
                .push(("inventario", self.inventario().await?.db().clone()));
            sources
                .groups
                .push(crate::services::inventario::GROUP.to_owned());
        }
        if components.catalogo {
            sources
                .databases
                .push(("catalogo", self.catalogo().await?.db().clone()));
        }
        if components.reparto {
            sources
                .databases
                .push(("reparto", self.reparto().await?.db().clone()));
        }
        if components.pagos {
            sources
                .databases
                .push(("pagos", self.pagos().await?.db().clone()));
        }
        if components.pasarela.is_some() {
            sources
                .databases
                .push(("pasarela", self.pasarela().await?.db().clone()));
        }
        let brokered = components.relay
            || components.inventario
            || components.catalogo
            || components.reparto
            || components.pagos
            || components.analitica;
        if brokered {
            sources.broker = Some(self.broker().await.context("opening the broker")?);
        }
        Ok(sources)
    }
}

/// Runs `components` until SIGINT/SIGTERM (or until one of them fails).
pub async fn run_until_signal(
    system: &System,
    components: Components,
    http: SocketAddr,
) -> anyhow::Result<()> {
    let running = system.start(components.clone(), http).await?;
    // One line on stdout when everything is up: scripts and crash tests wait for it (and
    // read the HTTP port from it when `--http` asked for port 0).
    println!(
        "{}",
        ready_line(&components, running.http_addr(), running.ops_addr())
    );
    let stop = running.stop_token();
    tokio::spawn(async move {
        entrega::signal().await;
        tracing::info!("signal received, stopping");
        stop.cancel();
    });
    running.wait().await
}

/// `km0 ready instance=NAME pedidos=ADDR relay inventario`: what runs, where.
fn ready_line(
    components: &Components,
    http: Option<SocketAddr>,
    ops: Option<SocketAddr>,
) -> String {
    let mut line = format!("km0 ready instance={}", components.instance);
    if let Some(addr) = http {
        let name = if components.pasarela.is_some() {
            "pasarela"
        } else {
            "pedidos"
        };
        line.push_str(&format!(" {name}={addr}"));
    }
    if components.relay {
        line.push_str(" relay");
    }
    if components.inventario {
        line.push_str(" inventario");
    }
    if components.catalogo {
        line.push_str(" catalogo");
    }
    if components.reparto {
        line.push_str(" reparto");
    }
    if components.analitica {
        line.push_str(" analitica");
    }
    if components.pagos {
        line.push_str(" pagos");
    }
    if let Some(url) = &components.pasarela_url {
        line.push_str(&format!(" pasarela_url={url}"));
    }
    if let Some(addr) = ops {
        line.push_str(&format!(" ops={addr}"));
        if components.console.is_some() {
            line.push_str(&format!(" console=http://{addr}/console/"));
        }
    }
    line
}
