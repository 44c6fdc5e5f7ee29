//! The real servers some scenarios need (Kafka, RabbitMQ, Redis): where they are, whether
//! they answer, and the names that keep one run's topics, queues and keys apart from every
//! other run's.

use std::time::Duration;

use clap::Args;
use serde::Serialize;

/// Where the scenarios whose failure belongs to a broker find it. The defaults are the
/// servers `scripts/services start` runs.
#[derive(Debug, Clone, Args, PartialEq, Eq)]
pub struct Brokers {
    /// Kafka's bootstrap servers, for the scenarios on Kafka.
    #[arg(
        long = "kafka",
        env = "KM0_LAB_KAFKA",
        default_value = "127.0.0.1:9092"
    )]
    pub kafka: String,
    /// RabbitMQ's URL, for the scenario on competing consumers.
    #[arg(
        long = "rabbitmq",
        env = "KM0_LAB_RABBITMQ",
        default_value = "amqp://guest:guest@127.0.0.1:5672"
    )]
    pub rabbitmq: String,
    /// Redis's URL, for the scenario on a lock with a TTL.
    #[arg(
        long = "redis",
        env = "KM0_LAB_REDIS",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis: String,
    /// The km0 executable a scenario runs a process of (default: this one).
    #[arg(long = "km0", env = "KM0_LAB_KM0", hide = true)]
    pub km0: Option<std::path::PathBuf>,
}

impl Default for Brokers {
    fn default() -> Self {
        Self {
            kafka: "127.0.0.1:9092".to_owned(),
            rabbitmq: "amqp://guest:guest@127.0.0.1:5672".to_owned(),
            redis: "redis://127.0.0.1:6379".to_owned(),
            km0: None,
        }
    }
}

/// What a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Needs {
    /// The embedded default: SQLite and the log in SQLite, nothing to start.
    Embedded,
    /// Apache Kafka.
    Kafka,
    /// RabbitMQ.
    Rabbitmq,
    /// Redis, beside the embedded default.
    Redis,
}

impl Needs {
    /// How the list names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Kafka => "Kafka",
            Self::Rabbitmq => "RabbitMQ",
            Self::Redis => "Redis",
        }
    }
}

impl Brokers {
    /// The URL the scenario of `needs` connects to (`None` for the embedded default).
    pub fn url(&self, needs: Needs) -> Option<&str> {
        match needs {
            Needs::Embedded => None,
            Needs::Kafka => Some(&self.kafka),
            Needs::Rabbitmq => Some(&self.rabbitmq),
            Needs::Redis => Some(&self.redis),
        }
    }

    /// Why a scenario of `needs` cannot run here, if it cannot: none of the servers its URL
    /// names accepts a connection within two seconds.
    pub async fn unreachable(&self, needs: Needs) -> Option<String> {
        let url = self.url(needs)?;
        let default_port = match needs {
            Needs::Kafka => 9092,
            Needs::Rabbitmq => 5672,
            _ => 6379,
        };
        let mut refused = Vec::new();
        for address in addresses(url, default_port) {
            let connect = tokio::net::TcpStream::connect(address.clone());
            match tokio::time::timeout(Duration::from_secs(2), connect).await {
                Ok(Ok(_)) => return None,
                Ok(Err(e)) => refused.push(format!("{address} ({e})")),
                Err(_) => refused.push(format!("{address} (no answer within 2 s)")),
            }
        }
        Some(format!(
            "{} does not answer at {}; `scripts/services start` starts it",
            needs.name(),
            refused.join(", ")
        ))
    }
}

/// `host:port` of every server a URL or a server list names.
fn addresses(url: &str, default_port: u16) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?']).next().unwrap_or_default();
    let servers = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|server| {
            let has_port = server
                .rsplit_once(':')
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
            if has_port {
                server.to_owned()
            } else {
                format!("{server}:{default_port}")
            }
        })
        .collect()
}

/// The Kafka URL of `brokers` with its names under `namespace`.
pub(super) fn kafka_url(brokers: &Brokers, namespace: &str) -> String {
    let servers = brokers
        .kafka
        .strip_prefix("kafka://")
        .unwrap_or(&brokers.kafka);
    let sep = if servers.contains('?') { '&' } else { '?' };
    format!("kafka://{servers}{sep}namespace={namespace}")
}

/// The RabbitMQ URL of `brokers` with its names under `namespace` and `params` added.
pub(super) fn amqp_url(brokers: &Brokers, namespace: &str, params: &str) -> String {
    let base = &brokers.rabbitmq;
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}namespace={namespace}&{params}")
}

/// Runs `side` with the broker at `url` (one of the lab's servers, named `what` in errors),
/// then removes everything made under the side's namespace and closes it.
pub(super) async fn with_broker(
    url: &str,
    what: &str,
    side: impl AsyncFnOnce(&entrega::Broker) -> anyhow::Result<super::Ledger>,
) -> anyhow::Result<super::Ledger> {
    use anyhow::Context as _;
    let broker = entrega::Broker::connect(url, Duration::from_secs(10))
        .await
        .with_context(|| format!("connecting to {what}"))?;
    let result = side(&broker).await;
    // A killed consumer's group keeps its member until its session ends.
    let removed = broker
        .remove_namespace_within(Duration::from_secs(30))
        .await
        .context("removing the lab's topics, queues and groups");
    broker.close().await;
    let ledger = result?;
    removed?;
    Ok(ledger)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_of_each_form_is_found() {
        assert_eq!(addresses("127.0.0.1:9092", 9092), ["127.0.0.1:9092"]);
        assert_eq!(
            addresses("kafka://a:1,b:2?linger.ms=0", 9092),
            ["a:1", "b:2"]
        );
        assert_eq!(
            addresses("amqp://guest:guest@127.0.0.1/%2f", 5672),
            ["127.0.0.1:5672"]
        );
        assert_eq!(
            addresses("amqp://u:p@h1:5682,h2/%2f?management=http://h1:15682", 5672),
            ["h1:5682", "h2:5672"]
        );
        assert_eq!(
            addresses("redis://localhost:7000", 6379),
            ["localhost:7000"]
        );
        assert_eq!(
            kafka_url(&Brokers::default(), "lab-1."),
            "kafka://127.0.0.1:9092?namespace=lab-1."
        );
    }
}
