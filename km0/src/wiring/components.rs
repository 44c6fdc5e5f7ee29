//! Starting km0's components for a deployment, in any combination, in this process: each
//! component starts itself ([`Component::start`]); this file only runs what was selected and
//! serves the operations endpoint over what they report.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use entrega::CancellationToken;

use super::component::{Component, InUp, Start};
use super::ops_server::{self, OpsSources};
use super::{System, Task};
use crate::services::inventario::ConsumerStats;
use crate::services::pasarela::Faults;

/// Which components to start, and the settings this process gives them.
#[derive(Debug, Clone)]
pub struct Components {
    selected: Vec<&'static dyn Component>,
    /// Relay lane owner and consumer group member name.
    pub instance: String,
    /// reparto's maps service; `None` computes routes in-process.
    pub mapas_url: Option<String>,
    /// The gateway pagos charges through; `None` is [`crate::services::pagos::DEFAULT_PASARELA_URL`].
    pub pasarela_url: Option<String>,
    /// The faults the payment gateway simulator injects, when it runs.
    pub faults: Faults,
    /// Where to serve `/metrics`, `/healthz` and `/readyz`; `None` serves nothing.
    pub ops: Option<SocketAddr>,
    /// Serve the web console on the operations endpoint, with these operators allowed to act.
    pub console: Option<crate::console::Operators>,
}

impl Components {
    /// The simple flow of an order ([`InUp::Always`]: pedidos, the relay, inventario,
    /// catalogo), as `km0 up` and `km0 demo` start it.
    pub fn all(instance: &str) -> Self {
        let mut components = Self::none(instance);
        for component in crate::services::COMPONENTS {
            if component.in_up() == InUp::Always {
                components.add(*component);
            }
        }
        components
    }

    /// Nothing yet; add components one by one.
    pub fn none(instance: &str) -> Self {
        Self {
            selected: Vec::new(),
            instance: instance.to_owned(),
            mapas_url: None,
            pasarela_url: None,
            faults: Faults::default(),
            ops: None,
            console: None,
        }
    }

    /// Adds `component` (once).
    pub fn add(&mut self, component: &'static dyn Component) {
        if !self.runs(component.name()) {
            self.selected.push(component);
        }
    }

    /// `self` with `component` added.
    pub fn with(mut self, component: &'static dyn Component) -> Self {
        self.add(component);
        self
    }

    /// Whether the component named `name` is selected.
    pub fn runs(&self, name: &str) -> bool {
        self.selected.iter().any(|c| c.name() == name)
    }

    /// The selected components, in the order of [`crate::services::COMPONENTS`].
    pub fn selected(&self) -> Vec<&'static dyn Component> {
        crate::services::COMPONENTS
            .iter()
            .copied()
            .filter(|c| self.runs(c.name()))
            .collect()
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
    /// Starts `components`; an HTTP API binds `http` (port 0 picks a free one).
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
        let selected = components.selected();
        let serving: Vec<&str> = selected
            .iter()
            .filter(|c| c.serves_http())
            .map(|c| c.name())
            .collect();
        anyhow::ensure!(
            serving.len() <= 1,
            "{} each serve HTTP: run them in separate processes",
            serving.join(" and ")
        );
        let mut sources = OpsSources::default();
        let mut brokered = false;
        for component in &selected {
            let started = component
                .start(Start {
                    system: self,
                    components: &components,
                    http,
                    stop: stop.clone(),
                })
                .await?;
            brokered |= component.uses_broker();
            running.tasks.extend(started.tasks);
            if started.http_addr.is_some() {
                running.http_addr = started.http_addr;
            }
            if started.inventario.is_some() {
                running.consumer_stats = started.inventario.clone();
            }
            for (name, db) in started.databases {
                let has_outbox = super::databases()
                    .iter()
                    .any(|d| d.name == name && d.outbox);
                if has_outbox && !sources.outboxes.iter().any(|(n, _)| *n == name) {
                    sources.outboxes.push((name, db.clone()));
                }
                if !sources.databases.iter().any(|(n, _)| *n == name) {
                    sources.databases.push((name, db));
                }
            }
            if let Some(db) = started.outbox {
                if !sources.outboxes.iter().any(|(n, _)| *n == "pedidos") {
                    sources.outboxes.push(("pedidos", db));
                }
            }
            sources.relay = sources.relay.take().or(started.relay);
            sources.inventario = sources.inventario.take().or(started.inventario);
            sources.sagas = sources.sagas.take().or(started.sagas);
            sources.workers.extend(started.workers);
            for owned in component.groups() {
                if !sources.groups.iter().any(|g| g == owned.group) {
                    sources.groups.push(owned.group.to_owned());
                }
            }
        }
        if let Some(addr) = components.ops {
            if brokered {
                sources.broker = Some(self.broker().await.context("opening the broker")?);
            }
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
    let selected = components.selected();
    if let Some(addr) = http {
        if let Some(server) = selected.iter().find(|c| c.serves_http()) {
            line.push_str(&format!(" {}={addr}", server.name()));
        }
    }
    for component in selected.iter().filter(|c| !c.serves_http()) {
        line.push(' ');
        line.push_str(component.name());
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
