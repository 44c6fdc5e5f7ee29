//! km0's broker: what `--broker` names (see [`BrokerUrl`]), opened as an [`entrega::Broker`].
//! The log transport's PostgreSQL database gets km0's default name and is created if
//! missing; on RabbitMQ, km0's groups get their queues' names; everything else is entrega's.

use std::time::Duration;

pub use entrega::Broker;
use entrega_core::StoreError;

use super::config::{split_database, BrokerUrl, BrokerUrlError};

/// Why the broker could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The `--broker` URL is not one km0 can use.
    #[error(transparent)]
    Url(#[from] BrokerUrlError),
    /// The log transport's PostgreSQL database could not be created.
    #[error("creating the log broker's database")]
    Store(#[from] StoreError),
    /// The broker could not be opened.
    #[error(transparent)]
    Open(#[from] entrega::BrokerError),
}

/// Opens the broker named by `url`: the log transport's database is created if missing and
/// migrated, and a group member of the log silent for `lease_ttl` loses its partitions;
/// Kafka's clients are built (they connect in the background) with the URL's settings.
pub async fn connect(url: &BrokerUrl, lease_ttl: Duration) -> Result<Broker, BrokerError> {
    let full = match url {
        BrokerUrl::PostgresLog(url) => {
            let (server, name) = split_database(url);
            let name = name.unwrap_or_else(|| "km0_broker".to_owned());
            entrega_postgres::ensure_database(&server, &name).await?
        }
        BrokerUrl::SqliteLog(url) | BrokerUrl::Kafka(url, _) | BrokerUrl::Amqp(url, _) => {
            url.clone()
        }
    };
    let broker = Broker::connect(&full, lease_ttl).await?;
    if let Some(amqp) = broker.as_amqp() {
        super::name_amqp_groups(amqp);
    }
    Ok(broker)
}
