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
    /// The log transport's database could not be created, opened or checked.
    #[error("opening the log broker's database")]
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
            let name = name.unwrap_or_else(|| LOG_DATABASE.to_owned());
            entrega_postgres::ensure_database(&server, &name).await?
        }
        BrokerUrl::SqliteLog(url) | BrokerUrl::Kafka(url, _) | BrokerUrl::Amqp(url, _) => {
            url.clone()
        }
    };
    let broker = Broker::connect(&full, lease_ttl).await?;
    super::name_groups(&broker);
    Ok(broker)
}

/// Opens the broker named by `url` without creating or migrating anything: the log
/// transport's database must exist with its schema current (`km0 migrate`), so a role that
/// may only read and write its rows can use it.
pub async fn connect_existing(url: &BrokerUrl, lease_ttl: Duration) -> Result<Broker, BrokerError> {
    let log_url = match url {
        BrokerUrl::PostgresLog(url) => {
            let (server, name) = split_database(url);
            super::config::with_database(&server, &name.unwrap_or_else(|| LOG_DATABASE.to_owned()))
        }
        BrokerUrl::SqliteLog(url) => url.clone(),
        BrokerUrl::Kafka(..) | BrokerUrl::Amqp(..) => return connect(url, lease_ttl).await,
    };
    let db = entrega::Db::connect(&log_url).await?;
    let behind = db.schema_behind().await?;
    if !behind.is_empty() {
        db.close().await;
        return Err(BrokerError::Store(StoreError::rejected(
            super::system::SchemaBehind {
                service: "broker",
                behind: behind.join(", "),
            },
        )));
    }
    Ok(Broker::log(&db, lease_ttl))
}

/// The log transport's PostgreSQL database when the URL names none.
pub const LOG_DATABASE: &str = "km0_broker";

/// The database the log transport keeps its records in, when `url` names one in PostgreSQL.
pub fn log_database(url: &BrokerUrl) -> Option<String> {
    match url {
        BrokerUrl::PostgresLog(url) => Some(
            split_database(url)
                .1
                .unwrap_or_else(|| LOG_DATABASE.to_owned()),
        ),
        _ => None,
    }
}
