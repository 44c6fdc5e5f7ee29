//! How much a queue holds: messages ready, messages delivered and not yet acknowledged, and
//! consumers. RabbitMQ has no offsets, so this is what a consumer group's lag is here.
//!
//! AMQP itself tells the ready count and the consumers, exactly (a passive `queue.declare`);
//! the unacknowledged count comes from the management plugin's HTTP API, when it answers
//! (`/api/queues/<vhost>/<queue>`, with the broker URL's credentials).

use std::time::Duration;

use entrega_core::TransportError;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::error::short;
use crate::link::Amqp;

/// One queue's depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    /// The queue.
    pub queue: String,
    /// Whether it exists.
    pub exists: bool,
    /// Messages waiting to be delivered.
    pub ready: u64,
    /// Messages delivered and not yet acknowledged; `None` when the management API did not
    /// answer.
    pub unacked: Option<u64>,
    /// Consumers subscribed to it.
    pub consumers: u32,
}

/// Longest wait for the management API.
const MANAGEMENT_TIMEOUT: Duration = Duration::from_secs(3);

impl Amqp {
    /// The depth of each of `queues`, in order; a missing queue is reported as such.
    pub async fn queue_depths(&self, queues: &[String]) -> Result<Vec<QueueDepth>, TransportError> {
        // One HTTP client (and its connection pool) for every queue asked about.
        let http = reqwest::Client::new();
        let mut out = Vec::with_capacity(queues.len());
        for queue in queues {
            out.push(self.depth(&http, queue).await?);
        }
        Ok(out)
    }

    async fn depth(
        &self,
        http: &reqwest::Client,
        queue: &str,
    ) -> Result<QueueDepth, TransportError> {
        // A passive declare of a missing queue closes its channel: one channel per queue.
        let channel = self.channel().await?;
        let declared = channel
            .queue_declare(
                short("queue", queue)?,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        let _ = channel.close(200, "entrega: inspected".into()).await;
        let Ok(declared) = declared else {
            return Ok(QueueDepth {
                queue: queue.to_owned(),
                exists: false,
                ready: 0,
                unacked: Some(0),
                consumers: 0,
            });
        };
        let management = self.management(http, queue).await;
        // The declare's counts are exact now; the management API's are sampled every few
        // seconds, so it is asked only for what AMQP cannot tell.
        Ok(QueueDepth {
            queue: queue.to_owned(),
            exists: true,
            ready: u64::from(declared.message_count()),
            unacked: management.as_ref().map(|m| m.unacked),
            consumers: declared.consumer_count(),
        })
    }

    /// The management API's counts for `queue`, or `None` when it does not answer.
    async fn management(&self, http: &reqwest::Client, queue: &str) -> Option<Management> {
        let api = self.config().management.as_ref()?;
        let url = format!(
            "{}/api/queues/{}/{}",
            api.base.trim_end_matches('/'),
            encode(&api.vhost),
            encode(queue)
        );
        let response = http
            .get(url)
            .basic_auth(&api.user, Some(&api.password))
            .timeout(MANAGEMENT_TIMEOUT)
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body: serde_json::Value = response.json().await.ok()?;
        let count = |name: &str| body.get(name).and_then(serde_json::Value::as_u64);
        Some(Management {
            unacked: count("messages_unacknowledged")?,
        })
    }
}

/// Queue and exchange names of the virtual host, as the management API lists them.
#[derive(Debug, Default)]
pub(crate) struct Listed {
    pub(crate) queues: Vec<String>,
    pub(crate) exchanges: Vec<String>,
}

impl Amqp {
    /// Every queue and exchange of the virtual host, from the management API; empty when it
    /// is turned off or does not answer.
    pub(crate) async fn listed_names(&self) -> Listed {
        let Some(api) = self.config().management.as_ref() else {
            return Listed::default();
        };
        let http = reqwest::Client::new();
        let names = |kind: &'static str| {
            let url = format!(
                "{}/api/{kind}/{}?columns=name",
                api.base.trim_end_matches('/'),
                encode(&api.vhost),
            );
            let request = http
                .get(url)
                .basic_auth(&api.user, Some(&api.password))
                .timeout(MANAGEMENT_TIMEOUT);
            async move {
                let Ok(response) = request.send().await else {
                    return Vec::new();
                };
                let body: serde_json::Value = match response.error_for_status() {
                    Ok(ok) => ok.json().await.unwrap_or_default(),
                    Err(_) => return Vec::new(),
                };
                body.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|item| item.get("name")?.as_str().map(str::to_owned))
                    .collect()
            }
        };
        Listed {
            queues: names("queues").await,
            exchanges: names("exchanges").await,
        }
    }
}

/// Counts read from the management API.
struct Management {
    unacked: u64,
}

/// Percent-encodes a path segment (`/` becomes `%2F`, as the API wants for the default vhost).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("/"), "%2F");
        assert_eq!(encode("inventario.pedidos.dlq"), "inventario.pedidos.dlq");
        assert_eq!(encode("a b"), "a%20b");
    }
}
