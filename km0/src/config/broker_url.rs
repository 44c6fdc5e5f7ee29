//! What a `--broker` URL names: the log transport in a database (`sqlite://FILE`,
//! `postgres://USER@HOST:PORT/DB`) or a Kafka cluster (`kafka://HOST:PORT[,HOST:PORT...][?PROPS]`).

use super::{is_postgres, sqlite_path};

/// Port of a Kafka bootstrap server given without one.
pub const DEFAULT_KAFKA_PORT: u16 = 9092;

/// The broker named by a `--broker` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerUrl {
    /// The log transport in an SQLite file (`sqlite://FILE`).
    SqliteLog(String),
    /// The log transport in a PostgreSQL database (`postgres://USER@HOST:PORT/DB`; database
    /// `km0_broker` when the URL names none), created if missing.
    PostgresLog(String),
    /// A Kafka cluster; the URL is kept whole (bootstrap servers and client properties).
    Kafka(String),
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
    /// `kafka://` without a host, or with an empty entry in its server list.
    #[error("broker url `{url}` names no host")]
    MissingHost {
        /// The URL as given.
        url: String,
    },
    /// A Kafka server whose port is not a number from 1 to 65535.
    #[error("broker url `{url}`: `{port}` is not a valid port")]
    BadPort {
        /// The URL as given.
        url: String,
        /// The offending port text.
        port: String,
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
        if let Some(rest) = url.strip_prefix("kafka://") {
            kafka_servers(url, rest)?;
            return Ok(Self::Kafka(url.to_owned()));
        }
        Err(BrokerUrlError::UnknownScheme {
            url: url.to_owned(),
        })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        match self {
            Self::SqliteLog(url) | Self::PostgresLog(url) | Self::Kafka(url) => url,
        }
    }

    /// Whether this is a Kafka cluster rather than the log transport in a database.
    pub fn is_kafka(&self) -> bool {
        matches!(self, Self::Kafka(_))
    }
}

/// The `host:port` pairs of a `kafka://` URL's authority (`rest` is the URL after the
/// scheme), the port defaulting to [`DEFAULT_KAFKA_PORT`].
pub fn kafka_servers(url: &str, rest: &str) -> Result<Vec<(String, u16)>, BrokerUrlError> {
    let authority = rest.split(['?', '/']).next().unwrap_or_default();
    let missing_host = || BrokerUrlError::MissingHost {
        url: url.to_owned(),
    };
    if authority.is_empty() {
        return Err(missing_host());
    }
    authority
        .split(',')
        .map(|server| {
            let (host, port) = match server.rsplit_once(':') {
                // `[::1]:9092`: the colon inside brackets is part of the host.
                Some((host, port)) if !port.contains(']') => (host, Some(port)),
                _ => (server, None),
            };
            if host.is_empty() || host == "[]" {
                return Err(missing_host());
            }
            let port = match port {
                None => DEFAULT_KAFKA_PORT,
                Some(text) => text
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| BrokerUrlError::BadPort {
                        url: url.to_owned(),
                        port: text.to_owned(),
                    })?,
            };
            Ok((host.to_owned(), port))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
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
        let kafka = BrokerUrl::parse("kafka://127.0.0.1:9092?session_timeout_ms=6000").unwrap();
        assert!(kafka.is_kafka());
        assert_eq!(
            kafka.as_str(),
            "kafka://127.0.0.1:9092?session_timeout_ms=6000"
        );
    }

    #[test]
    fn kafka_server_lists_parse_with_default_ports() {
        let url = "kafka://a:1,b,[::1]:9093?x=y";
        assert_eq!(
            kafka_servers(url, &url["kafka://".len()..]).unwrap(),
            vec![
                ("a".to_owned(), 1),
                ("b".to_owned(), DEFAULT_KAFKA_PORT),
                ("[::1]".to_owned(), 9093)
            ]
        );
    }

    #[test]
    fn bad_urls_are_typed_errors() {
        for url in [
            "kafka://",
            "kafka://?a=b",
            "kafka://:9092",
            "kafka://a:1,,b:2",
        ] {
            assert!(
                matches!(
                    BrokerUrl::parse(url),
                    Err(BrokerUrlError::MissingHost { .. })
                ),
                "{url}"
            );
        }
        for (url, port) in [
            ("kafka://h:x", "x"),
            ("kafka://h:70000", "70000"),
            ("kafka://h:0", "0"),
            ("kafka://h:", ""),
        ] {
            assert_eq!(
                BrokerUrl::parse(url),
                Err(BrokerUrlError::BadPort {
                    url: url.to_owned(),
                    port: port.to_owned()
                })
            );
        }
        assert!(matches!(
            BrokerUrl::parse("amqp://h"),
            Err(BrokerUrlError::UnknownScheme { .. })
        ));
        assert!(matches!(
            BrokerUrl::parse("sqlite://"),
            Err(BrokerUrlError::MissingFile { .. })
        ));
        let message = BrokerUrl::parse("kafka://h:x").unwrap_err().to_string();
        assert!(message.contains("`x` is not a valid port"), "{message}");
    }
}
