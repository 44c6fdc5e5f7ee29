//! What a `--broker` URL names: the log transport in a database (`sqlite://FILE`,
//! `postgres://USER@HOST:PORT/DB`) or a Kafka cluster (`kafka://HOST:PORT[,HOST:PORT...][?PROPS]`).

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
}

/// A `--broker` URL km0 cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerUrlError {
    /// Neither `sqlite:`, `postgres://` nor `kafka://`.
    #[error(
        "unsupported broker url `{url}`: expected sqlite://FILE, \
         postgres://USER@HOST:PORT/DB or kafka://HOST:PORT[,HOST:PORT...][?PROPS]"
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
}

impl BrokerUrl {
    /// Parses and checks a `--broker` URL.
    pub fn parse(url: &str) -> Result<Self, BrokerUrlError> {
        if let Some(path) = sqlite_path(url) {
            if path.is_empty() {
                return Err(BrokerUrlError::MissingFile {
                    url: url.to_owned(),
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
                    url: url.to_owned(),
                    source,
                });
        }
        Err(BrokerUrlError::UnknownScheme {
            url: url.to_owned(),
        })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        match self {
            Self::SqliteLog(url) | Self::PostgresLog(url) | Self::Kafka(url, _) => url,
        }
    }

    /// Whether this is a Kafka cluster rather than the log transport in a database.
    pub fn is_kafka(&self) -> bool {
        matches!(self, Self::Kafka(..))
    }
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
            BrokerUrl::parse("amqp://h"),
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
