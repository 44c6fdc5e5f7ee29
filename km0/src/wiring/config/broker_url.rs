//! What a `--broker` URL names: the log transport in a database (`sqlite://FILE`,
//! `postgres://USER@HOST:PORT/DB`), a Kafka cluster (`kafka://HOST:PORT[,HOST:PORT...][?PROPS]`)
//! or RabbitMQ (`amqp://USER:PASS@HOST:PORT[/VHOST][?PARAMS]`).

use entrega_amqp::{AmqpConfig, AmqpUrlError};
use entrega_kafka::{KafkaConfig, KafkaUrlError};

use super::{is_postgres, sqlite_path};

/// The broker named by a `--broker` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerUrl {
    /// The log transport in an SQLite file (`sqlite://FILE`).
    SqliteLog(String),
    /// The log transport in a PostgreSQL database (`postgres://USER@HOST:PORT/DB`; database
    /// `km0_broker` when the URL names none), created if missing.
    PostgresLog(String),
    /// A Kafka cluster: its URL and the client settings read from it (bootstrap servers,
    /// `session_timeout_ms` and the other parameters of [`KafkaConfig::from_url`]).
    Kafka(String, KafkaConfig),
    /// RabbitMQ: its URL, with km0's dead-letter exchange (`km0.dlx`) unless the URL names
    /// another, and the settings read from it ([`AmqpConfig::from_url`]).
    Amqp(String, AmqpConfig),
}

/// A `--broker` URL km0 cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerUrlError {
    /// Neither `sqlite:`, `postgres://`, `kafka://` nor `amqp://`.
    #[error(
        "unsupported broker url `{url}`: expected sqlite://FILE, \
         postgres://USER@HOST:PORT/DB, kafka://HOST:PORT[,HOST:PORT...][?PROPS] or \
         amqp://USER:PASS@HOST:PORT[/VHOST][?PARAMS]"
    )]
    UnknownScheme {
        /// The URL as given.
        url: String,
    },
    /// `sqlite://` without a file.
    #[error("broker url `{url}` names no database file")]
    MissingFile {
        /// The URL as given.
        url: String,
    },
    /// A `kafka://` URL that does not read: no host, a bad port, a malformed parameter.
    #[error("invalid kafka broker url `{url}`")]
    Kafka {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: KafkaUrlError,
    },
    /// An `amqp://` URL whose parameters do not read.
    #[error("invalid amqp broker url `{url}`")]
    Amqp {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: AmqpUrlError,
    },
}

impl BrokerUrl {
    /// Parses and checks a `--broker` URL.
    pub fn parse(url: &str) -> Result<Self, BrokerUrlError> {
        if let Some(path) = sqlite_path(url) {
            if path.is_empty() {
                return Err(BrokerUrlError::MissingFile {
                    url: entrega_core::redact_url(url),
                });
            }
            return Ok(Self::SqliteLog(url.to_owned()));
        }
        if is_postgres(url) {
            return Ok(Self::PostgresLog(url.to_owned()));
        }
        if is_kafka(url) {
            return KafkaConfig::from_url(url)
                .map(|config| Self::Kafka(url.to_owned(), config))
                .map_err(|source| BrokerUrlError::Kafka {
                    url: entrega_core::redact_url(url),
                    source,
                });
        }
        if entrega::broker::is_amqp_url(url) {
            let full = with_km0_dead_letters(url);
            return AmqpConfig::from_url(&full)
                .map(|config| Self::Amqp(full, config))
                .map_err(|source| BrokerUrlError::Amqp {
                    url: entrega_core::redact_url(url),
                    source,
                });
        }
        Err(BrokerUrlError::UnknownScheme {
            url: entrega_core::redact_url(url),
        })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        match self {
            Self::SqliteLog(url) | Self::PostgresLog(url) | Self::Kafka(url, _) => url,
            Self::Amqp(url, _) => url,
        }
    }

    /// Whether this is a Kafka cluster rather than the log transport in a database.
    pub fn is_kafka(&self) -> bool {
        matches!(self, Self::Kafka(..))
    }

    /// Whether this is RabbitMQ.
    pub fn is_amqp(&self) -> bool {
        matches!(self, Self::Amqp(..))
    }

    /// Whether the broker has read-process-write transactions (Kafka's), which analitica
    /// needs.
    pub fn has_transactions(&self) -> bool {
        self.is_kafka()
    }

    /// Whether the broker is a server of its own (Kafka, RabbitMQ) rather than the log
    /// transport in a database: nothing of it to migrate, create or remove per deployment.
    pub fn is_server(&self) -> bool {
        self.is_kafka() || self.is_amqp()
    }
}

/// km0's dead-letter exchange, as the seed declares it.
pub const DEAD_LETTER_EXCHANGE: &str = "km0.dlx";

/// `url` with `dead_letter_exchange=km0.dlx` added when it names none.
fn with_km0_dead_letters(url: &str) -> String {
    let (_, query) = url.split_once('?').unwrap_or((url, ""));
    if query
        .split('&')
        .any(|p| p.starts_with("dead_letter_exchange="))
    {
        return url.to_owned();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}dead_letter_exchange={DEAD_LETTER_EXCHANGE}")
}

/// Whether a URL names a Kafka cluster.
pub fn is_kafka(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("kafka://"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_scheme_names_its_broker() {
        assert_eq!(
            BrokerUrl::parse("sqlite://km0-data/broker.db").unwrap(),
            BrokerUrl::SqliteLog("sqlite://km0-data/broker.db".into())
        );
        assert_eq!(
            BrokerUrl::parse("postgres://p@h:5432/b").unwrap(),
            BrokerUrl::PostgresLog("postgres://p@h:5432/b".into())
        );
        let url = "kafka://127.0.0.1:9092,h2:9093?session_timeout_ms=7000";
        let BrokerUrl::Kafka(kept, config) = BrokerUrl::parse(url).unwrap() else {
            panic!("not kafka");
        };
        assert_eq!(kept, url);
        assert_eq!(config.bootstrap, "127.0.0.1:9092,h2:9093");
        assert_eq!(config.session_timeout, Duration::from_secs(7));
    }

    #[test]
    fn rabbitmq_gets_the_seeds_dead_letter_exchange_unless_told_otherwise() {
        let BrokerUrl::Amqp(url, config) =
            BrokerUrl::parse("amqp://guest:guest@127.0.0.1:5672").unwrap()
        else {
            panic!("not amqp");
        };
        assert_eq!(
            url,
            "amqp://guest:guest@127.0.0.1:5672?dead_letter_exchange=km0.dlx"
        );
        assert_eq!(config.dead_letter_exchange, "km0.dlx");
        let BrokerUrl::Amqp(_, config) =
            BrokerUrl::parse("amqp://h?shards=3&dead_letter_exchange=x.dlx").unwrap()
        else {
            panic!("not amqp");
        };
        assert_eq!(config.dead_letter_exchange, "x.dlx");
        assert_eq!(config.shards, 3);
    }

    #[test]
    fn bad_urls_are_typed_errors() {
        let kafka = |url: &str| match BrokerUrl::parse(url) {
            Err(BrokerUrlError::Kafka { source, .. }) => source,
            other => panic!("{url}: {other:?}"),
        };
        assert_eq!(kafka("kafka://"), KafkaUrlError::NoBrokers);
        assert_eq!(kafka("kafka://?a=b"), KafkaUrlError::NoBrokers);
        assert!(matches!(
            kafka("kafka://:9092"),
            KafkaUrlError::Broker { .. }
        ));
        assert!(matches!(
            kafka("kafka://h:70000"),
            KafkaUrlError::Port { .. }
        ));
        assert!(matches!(kafka("kafka://h:x"), KafkaUrlError::Port { .. }));
        assert!(matches!(
            BrokerUrl::parse("amqp://h?prefetch=0"),
            Err(BrokerUrlError::Amqp { .. })
        ));
        assert!(matches!(
            BrokerUrl::parse("nats://h"),
            Err(BrokerUrlError::UnknownScheme { .. })
        ));
        assert!(matches!(
            BrokerUrl::parse("sqlite://"),
            Err(BrokerUrlError::MissingFile { .. })
        ));
        let error = anyhow::Error::from(BrokerUrl::parse("kafka://h:x").unwrap_err());
        assert_eq!(
            format!("{error:#}"),
            "invalid kafka broker url `kafka://h:x`: broker `h:x` has an invalid port"
        );
    }
}
