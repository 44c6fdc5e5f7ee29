//! What an `amqp://` URL says: the broker's address and credentials (passed to lapin as they
//! are) and entrega's own settings, given as query parameters.

use std::time::Duration;

use crate::layout::QueueLayout;

/// How to reach RabbitMQ and how entrega uses it. Its `Debug` hides the URI's password.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpConfig {
    /// `amqp://USER:PASS@HOST:PORT/VHOST`, without entrega's parameters: the first node's.
    pub uri: String,
    /// One such URI per node the URL names (`amqp://USER:PASS@HOST1:PORT1,HOST2:PORT2/VHOST`),
    /// tried in turn whenever a connection is opened, so that clients move to a node still
    /// running when theirs dies. Just `uri` for a URL naming one node.
    pub uris: Vec<String>,
    /// Longest wait for a connection (and its first channel) to open.
    pub connect_timeout: Duration,
    /// Longest wait for the broker to confirm a batch.
    pub confirm_timeout: Duration,
    /// First wait after a failed connection attempt; doubles up to `reconnect_max`.
    pub reconnect_base: Duration,
    /// Longest wait between connection attempts.
    pub reconnect_max: Duration,
    /// Unacknowledged deliveries a consumer holds at once (`basic.qos`, per consumer).
    pub prefetch: u16,
    /// Shard queues of a consumer group per topic (the topic's partitions).
    pub shards: u32,
    /// Deliveries a shard queue allows one message (`x-delivery-limit`) before it moves it
    /// to the group's dead-letter queue.
    pub delivery_limit: u32,
    /// The direct exchange every group's dead letters go through, routed by the group's base
    /// name to `<base>.dlq` (the seed's `km0.dlx`).
    pub dead_letter_exchange: String,
    /// A prefix put before every exchange and queue name sent to the broker (URL parameter
    /// `namespace`), keeping these clients apart from others on a shared virtual host;
    /// records come back under the names callers gave. None by default.
    pub namespace: entrega_core::Namespace,
    /// The layout of groups not given one by [`Amqp::set_group`](crate::Amqp::set_group).
    pub layout: QueueLayout,
    /// The management plugin's HTTP API, for unacknowledged counts; `None` when turned off.
    pub management: Option<ManagementApi>,
    /// A certificate authority (PEM file) trusted for `amqps://`, besides the public roots
    /// (URL parameter `tls_ca`).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Queues for a cluster (URL parameter `queues=quorum`; the default when the URL names
    /// several nodes, `queues=classic` turns it off): the dead-letter, wait and request
    /// queues are quorum queues too, replicated across the nodes like the shard queues, and
    /// a message moves from one queue to another (dead-lettered, or back from a wait) at least
    /// once: the shard and wait queues dead-letter with RabbitMQ's `at-least-once` strategy
    /// (which needs `x-overflow: reject-publish`). A queue declared before with the other
    /// choice refuses the declaration, naming the queue; the shared layout keeps the seed's
    /// classic queue either way.
    pub replicated: bool,
}

/// Where RabbitMQ's management HTTP API answers, and as whom.
#[derive(Clone, PartialEq, Eq)]
pub struct ManagementApi {
    /// `http://HOST:PORT`.
    pub base: String,
    /// The virtual host the queues are in.
    pub vhost: String,
    /// User name.
    pub user: String,
    /// Password.
    pub password: String,
}

impl std::fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("uri", &entrega_core::redact_url(&self.uri))
            .field("connect_timeout", &self.connect_timeout)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("reconnect_base", &self.reconnect_base)
            .field("reconnect_max", &self.reconnect_max)
            .field("prefetch", &self.prefetch)
            .field("shards", &self.shards)
            .field("delivery_limit", &self.delivery_limit)
            .field("dead_letter_exchange", &self.dead_letter_exchange)
            .field("namespace", &self.namespace)
            .field("layout", &self.layout)
            .field("management", &self.management)
            .field("tls_ca", &self.tls_ca)
            .finish()
    }
}

impl std::fmt::Debug for ManagementApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementApi")
            .field("base", &self.base)
            .field("vhost", &self.vhost)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// An `amqp://` URL entrega cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpUrlError {
    /// Not `amqp://` or `amqps://`.
    #[error("expected amqp://USER:PASS@HOST:PORT[/VHOST][?PARAMS], got `{0}`")]
    Scheme(String),
    /// A parameter entrega reads has a value it cannot use.
    #[error("parameter `{name}`: `{value}` is not {expected}")]
    Value {
        /// The parameter.
        name: String,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
}

/// entrega's parameters, taken off the URL before lapin reads it.
const OWN: [&str; 13] = [
    "namespace",
    "queues",
    "tls_ca",
    "management",
    "dead_letter_exchange",
    "layout",
    "delivery_limit",
    "connect_timeout_ms",
    "confirm_timeout_ms",
    "reconnect_base_ms",
    "reconnect_max_ms",
    "prefetch",
    "shards",
];

/// The heartbeat asked of the broker when the URL names none (seconds).
const DEFAULT_HEARTBEAT: &str = "heartbeat=10";

impl AmqpConfig {
    /// Reads `amqp://USER:PASS@HOST:PORT[/VHOST][?PARAMS]`. entrega's parameters
    /// (`connect_timeout_ms`, default 5000; `confirm_timeout_ms`, 30000;
    /// `reconnect_base_ms`, 100; `reconnect_max_ms`, 10000; `prefetch`, 100; `shards`, 6;
    /// `delivery_limit`, 20; `dead_letter_exchange`, `entrega.dlx`; `tls_ca`, a PEM file of
    /// certificate authorities trusted for `amqps://`; `layout`, `sharded` or
    /// `shared`; `queues`, `quorum` or `classic` (see [`AmqpConfig::replicated`]);
    /// `namespace`, a prefix put before every exchange and queue name; `management`, the management API's `http://HOST:PORT`, default the broker's
    /// host on port 15672, or `off`) are taken out;
    /// any other parameter (`heartbeat`, default 10 s; `frame_max`, ...) is left for lapin.
    pub fn from_url(url: &str) -> Result<Self, AmqpUrlError> {
        let lower = url.to_ascii_lowercase();
        if !lower.starts_with("amqp://") && !lower.starts_with("amqps://") {
            return Err(AmqpUrlError::Scheme(entrega_core::redact_url(url)));
        }
        let mut config = Self {
            uri: String::new(),
            uris: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(30),
            reconnect_base: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            prefetch: 100,
            shards: 6,
            delivery_limit: 20,
            dead_letter_exchange: "entrega.dlx".to_owned(),
            namespace: entrega_core::Namespace::none(),
            layout: QueueLayout::Sharded,
            management: None,
            tls_ca: None,
            replicated: false,
        };
        let mut replicated = None;
        let mut management = Some(None);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !OWN.contains(&name) {
                kept.push(pair);
                continue;
            }
            let bad_as = |expected| AmqpUrlError::Value {
                name: name.to_owned(),
                value: value.to_owned(),
                expected,
            };
            match name {
                "namespace" => {
                    config.namespace = entrega_core::Namespace::new(value)
                        .map_err(|_| bad_as("1 to 64 of A-Z a-z 0-9 . _ -"))?;
                    continue;
                }
                "dead_letter_exchange" if !value.is_empty() && value.len() <= 255 => {
                    config.dead_letter_exchange = value.to_owned();
                    continue;
                }
                "dead_letter_exchange" => return Err(bad_as("an exchange name")),
                "management" if value == "off" => {
                    management = None;
                    continue;
                }
                "management" if value.starts_with("http://") => {
                    management = Some(Some(value.to_owned()));
                    continue;
                }
                "management" => return Err(bad_as("`off` or http://HOST:PORT")),
                "tls_ca" if !value.is_empty() => {
                    config.tls_ca = Some(std::path::PathBuf::from(value));
                    continue;
                }
                "tls_ca" => return Err(bad_as("the path of a PEM file")),
                "queues" => {
                    replicated = Some(match value {
                        "quorum" => true,
                        "classic" => false,
                        _ => return Err(bad_as("`quorum` or `classic`")),
                    });
                    continue;
                }
                "layout" => {
                    config.layout = match value {
                        "sharded" => QueueLayout::Sharded,
                        "shared" => QueueLayout::Shared,
                        _ => return Err(bad_as("`sharded` or `shared`")),
                    };
                    continue;
                }
                _ => {}
            }
            let bad = || bad_as("a positive whole number");
            let n: u64 = value.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?;
            match name {
                "connect_timeout_ms" => config.connect_timeout = Duration::from_millis(n),
                "confirm_timeout_ms" => config.confirm_timeout = Duration::from_millis(n),
                "reconnect_base_ms" => config.reconnect_base = Duration::from_millis(n),
                "reconnect_max_ms" => config.reconnect_max = Duration::from_millis(n),
                "shards" => config.shards = u32::try_from(n).map_err(|_| bad())?,
                "delivery_limit" => {
                    config.delivery_limit = u32::try_from(n).map_err(|_| bad())?;
                }
                _ => config.prefetch = u16::try_from(n).map_err(|_| bad())?,
            }
        }
        // Heartbeats every 10 s unless the URL says otherwise: a half-open connection is
        // noticed after two missed ones, not after the broker's default of 60 s each.
        if !kept.iter().any(|p| p.starts_with("heartbeat=")) {
            kept.push(DEFAULT_HEARTBEAT);
        }
        let query = kept.join("&");
        config.uris = per_node(base)
            .into_iter()
            .map(|node| format!("{node}?{query}"))
            .collect();
        config.uri = config.uris.first().cloned().unwrap_or_default();
        config.replicated = replicated.unwrap_or(config.uris.len() > 1);
        config.management = management.and_then(|given| management_api(&config.uri, given));
        Ok(config)
    }
}

/// `scheme://[USER:PASS@]HOST1:PORT1,HOST2:PORT2[/VHOST]` as one URL per node, each with
/// the same credentials and virtual host.
fn per_node(base: &str) -> Vec<String> {
    let Some((scheme, rest)) = base.split_once("://") else {
        return vec![base.to_owned()];
    };
    let (authority, path) = rest
        .find('/')
        .map_or((rest, ""), |at| (&rest[..at], &rest[at..]));
    let (userinfo, hosts) = authority
        .rsplit_once('@')
        .map_or(("", authority), |(user, hosts)| (user, hosts));
    let user = if userinfo.is_empty() {
        String::new()
    } else {
        format!("{userinfo}@")
    };
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|host| format!("{scheme}://{user}{host}{path}"))
        .collect()
}

/// The management API of the broker at `uri`: `given` (`http://HOST:PORT`), or the broker's
/// host on port 15672, with the URI's credentials (guest/guest when it has none) and vhost.
fn management_api(uri: &str, given: Option<String>) -> Option<ManagementApi> {
    let parsed: lapin::uri::AMQPUri = uri.parse().ok()?;
    let base = given.unwrap_or_else(|| format!("http://{}:15672", parsed.authority.host));
    Some(ManagementApi {
        base,
        vhost: parsed.vhost,
        user: parsed.authority.userinfo.username,
        password: parsed.authority.userinfo.password,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_url_naming_several_nodes_gives_one_uri_per_node() {
        let c = AmqpConfig::from_url(
            "amqp://guest:guest@127.0.0.1:5682,127.0.0.1:5683,127.0.0.1:5684/%2f?prefetch=8",
        )
        .unwrap();
        assert_eq!(
            c.uris,
            [
                "amqp://guest:guest@127.0.0.1:5682/%2f?heartbeat=10",
                "amqp://guest:guest@127.0.0.1:5683/%2f?heartbeat=10",
                "amqp://guest:guest@127.0.0.1:5684/%2f?heartbeat=10",
            ]
        );
        assert_eq!(c.uri, c.uris[0]);
        assert_eq!(c.prefetch, 8);
        assert!(c.replicated, "a cluster's queues are quorum queues");
        let one = AmqpConfig::from_url("amqp://h").unwrap();
        assert!(!one.replicated);
        assert!(
            AmqpConfig::from_url("amqp://h?queues=quorum")
                .unwrap()
                .replicated
        );
        assert!(
            !AmqpConfig::from_url("amqp://a,b?queues=classic")
                .unwrap()
                .replicated
        );
        assert!(AmqpConfig::from_url("amqp://h?queues=mirrored").is_err());
        assert_eq!(one.uris, ["amqp://h?heartbeat=10"]);
        assert_eq!(
            one.management.map(|m| m.base).as_deref(),
            Some("http://h:15672")
        );
    }

    #[test]
    fn entregas_parameters_are_taken_out_and_the_rest_left_for_lapin() {
        let c = AmqpConfig::from_url(
            "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10&prefetch=8&connect_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(c.uri, "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10");
        assert_eq!(c.prefetch, 8);
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(AmqpConfig::from_url("amqp://h").unwrap().prefetch, 100);
        assert!(matches!(
            AmqpConfig::from_url("kafka://h"),
            Err(AmqpUrlError::Scheme(_))
        ));
        assert!(matches!(
            AmqpConfig::from_url("amqp://h?prefetch=0"),
            Err(AmqpUrlError::Value { .. })
        ));
        assert!(AmqpConfig::from_url("amqp://h?prefetch=70000").is_err());
        let seed =
            AmqpConfig::from_url("amqp://h?dead_letter_exchange=km0.dlx&layout=shared").unwrap();
        assert_eq!(seed.dead_letter_exchange, "km0.dlx");
        assert_eq!(seed.layout, QueueLayout::Shared);
        assert_eq!(
            seed.uri, "amqp://h?heartbeat=10",
            "a 10 s heartbeat by default"
        );
        assert!(AmqpConfig::from_url("amqp://h?layout=ring").is_err());
        let scoped = AmqpConfig::from_url("amqp://h?namespace=demo-1.").unwrap();
        assert_eq!(scoped.namespace.prefix(), "demo-1.");
        assert_eq!(scoped.uri, "amqp://h?heartbeat=10", "not lapin's");
        assert!(AmqpConfig::from_url("amqp://h?namespace=a%20b").is_err());
        let api = AmqpConfig::from_url("amqp://u:p@rabbit:5672/%2f")
            .unwrap()
            .management
            .unwrap();
        assert_eq!(api.base, "http://rabbit:15672");
        assert_eq!((api.vhost.as_str(), api.user.as_str()), ("/", "u"));
        let slow = AmqpConfig::from_url("amqp://h?heartbeat=30").unwrap();
        assert_eq!(slow.uri, "amqp://h?heartbeat=30");
        let off = AmqpConfig::from_url("amqp://h?management=off").unwrap();
        assert_eq!(off.management, None);
        assert!(!format!("{api:?}").contains("\"p\""));
    }
}
