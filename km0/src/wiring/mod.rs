//! How km0's parts come together for one deployment: where its data lives (`--database`,
//! `--broker`: [`config`]), its databases and broker ([`System`], [`Broker`]), its topics, and
//! the components started from them in this process ([`Components`], [`Running`]).

pub mod config;

mod broker;
mod components;
pub mod http_server;
mod ops_server;
mod spawn;
mod spawn_inventario;
mod spawn_pagos;
mod spawn_saga;
mod system;
pub mod tls;
mod together;
mod topics;

pub use broker::{connect as connect_broker, Broker, BrokerError};
pub use components::{run_until_signal, Components, Running};
pub use spawn::ASSIGN_EVERY;
pub use spawn_inventario::{inventario_routing, INVENTARIO_SOURCE};
pub use spawn_pagos::DEFAULT_PASARELA_URL;
pub use spawn_saga::SAGA_GROUP;
pub use system::{Retention, SchemaBehind, SchemaMode, System, DEFAULT_LEASE_TTL};
pub use topics::{
    dead_letter_topic, dead_letters_of, ensure_topic_and_dlq, ensure_topics, name_amqp_groups,
    AMQP_GROUPS, TOPICS,
};

/// A component running as a task until stopped.
pub(crate) type Task = tokio::task::JoinHandle<anyhow::Result<()>>;
