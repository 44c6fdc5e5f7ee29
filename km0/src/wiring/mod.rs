//! How km0's parts come together for one deployment: where its data lives (`--database`,
//! `--broker`: [`config`]), its databases and broker ([`System`], [`Broker`]), its topics, what
//! a component is ([`Component`]) and the components started in this process
//! ([`Components`], [`Running`]).

pub mod config;

mod broker;
mod component;
mod components;
mod http_metrics;
pub mod http_server;
mod lifecycle;
pub(crate) mod openapi_route;
mod ops_server;
pub mod relay;
pub use ops_server::openapi as ops_openapi;
mod settings;
mod spawn;
mod system;
pub mod tls;
mod together;
mod topics;

pub use broker::{connect as connect_broker, Broker, BrokerError};
pub use component::{
    databases, groups, named, topics, Component, Database, GroupQueue, InUp, Start, Started,
};
pub use components::{run_until_signal, Components, Running};
pub use settings::{Retention, SchemaMode, DEFAULT_LEASE_TTL};
pub use spawn::{
    consumer_worker, consumer_worker_keyed, outbox_relay, serve_http, spawn_inbox_purge, RELAY_POLL,
};
pub use system::{SchemaBehind, System};
pub use together::{run_together, Part};
pub use topics::{
    dead_letter_topic, dead_letters_of, ensure_topic_and_dlq, ensure_topics, name_groups,
};

/// A component running as a task until stopped.
pub type Task = tokio::task::JoinHandle<anyhow::Result<()>>;
