//! What a component of km0 is. Each service folder describes its components (what they are
//! called, the database they own, the topics and consumer groups they own, how they start)
//! and [`crate::services::COMPONENTS`] lists them once; `km0 run`, `up`, `migrate` and `demo`,
//! the operations endpoint and the topic set-up all read that list.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use entrega::saga::Sagas;
use entrega::{CancellationToken, Db, RelayStats, WorkerStats};
use entrega_core::StoreError;
use futures::future::BoxFuture;

use super::{Components, System, Task};
use crate::services::inventario::ConsumerStats;

/// A database a service owns: one SQLite file `<name>.db` or one PostgreSQL database
/// `km0_<name>` (or `<prefix><name>`).
#[derive(Debug)]
pub struct Database {
    /// The service's name, which names the file or database.
    pub name: &'static str,
    /// Creates entrega's tables and the service's own in `db`, if missing.
    pub migrate: for<'a> fn(&'a Db) -> BoxFuture<'a, Result<(), StoreError>>,
    /// Whether the database holds entrega's tables (checked by readiness and by processes
    /// that do not migrate); `false`: only the service's own migration set, named as it.
    pub entrega_tables: bool,
    /// Whether the service publishes events through an outbox in it.
    pub outbox: bool,
}

impl PartialEq for Database {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Database {}

/// A consumer group a component owns, on one topic, with the base name of its queues on
/// RabbitMQ (the seed's `inventario.pedidos` for inventario's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupQueue {
    /// The consumer group.
    pub group: &'static str,
    /// The topic it reads.
    pub topic: &'static str,
    /// The base name of its queues on RabbitMQ.
    pub queue: &'static str,
}

/// When `km0 up` (and the demo) run a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InUp {
    /// Always: the simple flow of an order.
    Always,
    /// When orders run through the order saga.
    WithSaga,
    /// When the broker has transactions (Kafka).
    WithTransactions,
    /// Never in `up`'s process: it serves HTTP of its own and is started apart.
    Apart,
}

/// What a started component hands the process: its tasks, its HTTP address, and what the
/// operations endpoint reports on.
#[derive(Default)]
pub struct Started {
    /// The tasks, each named for errors.
    pub tasks: Vec<(&'static str, Task)>,
    /// Where its HTTP API listens, if it serves one.
    pub http_addr: Option<SocketAddr>,
    /// The databases it uses, by service name (readiness).
    pub databases: Vec<(&'static str, Db)>,
    /// The database whose outbox backlog the endpoint reports.
    pub outbox: Option<Db>,
    /// The relay's counters.
    pub relay: Option<Arc<RelayStats>>,
    /// inventario's counters.
    pub inventario: Option<Arc<ConsumerStats>>,
    /// The order sagas, when their orchestrator runs.
    pub sagas: Option<Sagas>,
    /// The workers' counters, by consumer group.
    pub workers: Vec<(&'static str, Arc<WorkerStats>)>,
}

/// What a component starts with.
pub struct Start<'a> {
    /// The deployment.
    pub system: &'a System,
    /// The selection it is part of, with the process's settings.
    pub components: &'a Components,
    /// Where an HTTP API binds (port 0 picks one).
    pub http: SocketAddr,
    /// Stops the component when cancelled.
    pub stop: CancellationToken,
}

/// One component of km0.
#[async_trait]
pub trait Component: Send + Sync {
    /// Its name: `km0 run <name>`, the ready line, logs.
    fn name(&self) -> &'static str;
    /// What it does, for `km0 run --help`.
    fn about(&self) -> &'static str;
    /// The database it owns or uses, if any.
    fn database(&self) -> Option<&'static Database>;
    /// The topics it publishes to, created before anything runs.
    fn topics(&self) -> &'static [&'static str] {
        &[]
    }
    /// The consumer groups it owns.
    fn groups(&self) -> &'static [GroupQueue] {
        &[]
    }
    /// Whether it uses the broker.
    fn uses_broker(&self) -> bool {
        true
    }
    /// Whether it serves an HTTP API on the process's `--http` address (one per process).
    fn serves_http(&self) -> bool {
        false
    }
    /// When `km0 up` runs it.
    fn in_up(&self) -> InUp;
    /// Starts it.
    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started>;
}

impl std::fmt::Debug for dyn Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for dyn Component {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

/// The component named `name`, if km0 has one.
pub fn named(name: &str) -> Option<&'static dyn Component> {
    crate::services::COMPONENTS
        .iter()
        .copied()
        .find(|c| c.name() == name)
}

/// Every database of km0's components, each once, in the components' order.
pub fn databases() -> Vec<&'static Database> {
    let mut found: Vec<&'static Database> = Vec::new();
    for database in crate::services::COMPONENTS
        .iter()
        .filter_map(|c| c.database())
    {
        if !found.contains(&database) {
            found.push(database);
        }
    }
    found
}

/// Every topic km0's components publish to, each once.
pub fn topics() -> Vec<&'static str> {
    let mut found: Vec<&'static str> = Vec::new();
    for topic in crate::services::COMPONENTS
        .iter()
        .flat_map(|c| c.topics().iter().copied())
    {
        if !found.contains(&topic) {
            found.push(topic);
        }
    }
    found
}

/// Every consumer group of km0's components.
pub fn groups() -> Vec<GroupQueue> {
    crate::services::COMPONENTS
        .iter()
        .flat_map(|c| c.groups().iter().copied())
        .collect()
}
