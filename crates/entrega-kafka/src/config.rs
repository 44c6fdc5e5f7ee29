//! Connection settings, their `kafka://` URL form, and the librdkafka properties they become.

use std::time::Duration;

use rdkafka::ClientConfig;

use crate::scope::Role;

/// How to reach a Kafka cluster and how the clients behave.
///
/// Build it with [`KafkaConfig::new`] or [`KafkaConfig::from_url`], then adjust it with the
/// `with_*` methods. Properties in [`KafkaConfig::overrides`] are applied last, over every
/// property this crate sets.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port`, comma separated.
    pub bootstrap: String,
    /// `client.id` of the producer, admin and inspection clients (consumers use the member name).
    pub client_id: String,
    /// Consumer group `session.timeout.ms`: how long a silent member keeps its partitions.
    /// 6 s with one bootstrap broker; 15 s with several ([`CLUSTER_SESSION_TIMEOUT`]).
    pub session_timeout: Duration,
    /// Producer `message.timeout.ms`: how long a message may wait for its delivery report.
    pub delivery_timeout: Duration,
    /// Timeout of metadata, watermark, offset and admin requests.
    pub request_timeout: Duration,
    /// Replication factor of the topics [`crate::KafkaAdmin`] creates; `None` (the default)
    /// leaves it to the brokers' `default.replication.factor`, so a cluster configured for
    /// three copies gets three. With `acks=all` (entrega's producer), a record is confirmed
    /// once every in-sync replica has it, and `min.insync.replicas` (a broker or topic
    /// setting) decides how many that must at least be.
    pub replication_factor: Option<u16>,
    /// A prefix put before every topic and group name sent to the cluster (URL parameter
    /// `namespace`), keeping these clients apart from others on a shared cluster; records
    /// come back under the names callers gave. None by default.
    pub namespace: entrega_core::Namespace,
    /// Extra librdkafka properties, applied last to every client.
    pub overrides: Vec<(String, String)>,
}

/// Shows every setting but the values of secret overrides (`sasl.password`, ...).
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap", &self.bootstrap)
            .field("client_id", &self.client_id)
            .field("session_timeout", &self.session_timeout)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("replication_factor", &self.replication_factor)
            .field("namespace", &self.namespace)
            .field("overrides", &entrega_core::redact_settings(&self.overrides))
            .finish()
    }
}

/// A `kafka://` URL that could not be read; names the part that was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaUrlError {
    /// The URL does not start with `kafka://`.
    #[error("expected a kafka:// url, got `{url}`")]
    Scheme {
        /// The URL given.
        url: String,
    },
    /// No broker address before the query.
    #[error("the url names no broker")]
    NoBrokers,
    /// A broker address is not `host:port`.
    #[error("broker `{broker}` is not host:port")]
    Broker {
        /// The address as written.
        broker: String,
    },
    /// A broker's port is not a number from 1 to 65535.
    #[error("broker `{broker}` has an invalid port")]
    Port {
        /// The address as written.
        broker: String,
    },
    /// Something after the brokers other than a query.
    #[error("unexpected path `{path}` after the brokers")]
    Path {
        /// The path found.
        path: String,
    },
    /// A query parameter without `=value`, or with an empty name.
    #[error("query parameter `{param}` is not name=value")]
    Param {
        /// The parameter as written.
        param: String,
    },
    /// A `namespace` a broker would refuse as part of a name.
    #[error(transparent)]
    Namespace(#[from] entrega_core::InvalidNamespace),
    /// A parameter that needs a number got something else.
    #[error("`{name}` needs a positive whole number, got `{value}`")]
    Number {
        /// The parameter's name.
        name: String,
        /// The value given.
        value: String,
    },
}

const DEFAULT_CLIENT_ID: &str = "entrega";

/// The default session timeout with a single bootstrap broker: a member that died is
/// replaced within 6 s.
pub const SINGLE_BROKER_SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// The default session timeout when the bootstrap list names several brokers (a cluster).
///
/// It outlasts the controller's fencing of a dead broker (`broker.session.timeout.ms`, 9 s
/// by Kafka's default). Until that fencing, an offset commit to a partition of
/// `__consumer_offsets` that had a replica on the dead broker waits for it, and the group
/// coordinator answers no heartbeat queued behind that commit. With a session shorter than
/// the fencing, every broker death would end every member's session and rebalance the
/// group; with this one, the members carry on and only the dead broker's partitions wait
/// for their new leaders.
pub const CLUSTER_SESSION_TIMEOUT: Duration = Duration::from_secs(15);

impl KafkaConfig {
    /// Settings for the brokers at `bootstrap` (`host:port`, comma separated), with defaults:
    /// client id `entrega`, a 6 s session timeout (15 s when `bootstrap` names several
    /// brokers, see [`CLUSTER_SESSION_TIMEOUT`]), 30 s delivery timeout, 10 s request timeout,
    /// the brokers' default replication factor, no overrides.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        let bootstrap = bootstrap.into();
        let session_timeout = if bootstrap
            .split(',')
            .filter(|b| !b.trim().is_empty())
            .count()
            > 1
        {
            CLUSTER_SESSION_TIMEOUT
        } else {
            SINGLE_BROKER_SESSION_TIMEOUT
        };
        Self {
            bootstrap,
            client_id: DEFAULT_CLIENT_ID.to_owned(),
            session_timeout,
            delivery_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            replication_factor: None,
            namespace: entrega_core::Namespace::none(),
            overrides: Vec::new(),
        }
    }

    /// Reads `kafka://host:port[,host:port...][?name=value&...]`.
    ///
    /// Known parameters: `client_id`, `session_timeout_ms`, `delivery_timeout_ms`,
    /// `request_timeout_ms`, `replication_factor`, `namespace`. Any other `name=value` is passed to
    /// librdkafka as a property (e.g. `max.poll.interval.ms=10000`).
    pub fn from_url(url: &str) -> Result<Self, KafkaUrlError> {
        let rest = strip_scheme(url).ok_or_else(|| KafkaUrlError::Scheme {
            url: entrega_core::redact_url(url),
        })?;
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (brokers, path) = match authority.find('/') {
            Some(i) => authority.split_at(i),
            None => (authority, ""),
        };
        if !path.is_empty() && path != "/" {
            return Err(KafkaUrlError::Path {
                path: path.to_owned(),
            });
        }
        let mut config = Self::new(parse_brokers(brokers)?);
        for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = match param.split_once('=') {
                Some((n, v)) if !n.is_empty() => (n, v),
                _ => {
                    return Err(KafkaUrlError::Param {
                        param: param.to_owned(),
                    })
                }
            };
            config.apply_param(name, value)?;
        }
        Ok(config)
    }

    fn apply_param(&mut self, name: &str, value: &str) -> Result<(), KafkaUrlError> {
        match name {
            "client_id" => self.client_id = value.to_owned(),
            "session_timeout_ms" => self.session_timeout = millis(name, value)?,
            "delivery_timeout_ms" => self.delivery_timeout = millis(name, value)?,
            "request_timeout_ms" => self.request_timeout = millis(name, value)?,
            "replication_factor" => {
                self.replication_factor = Some(
                    value
                        .parse::<u16>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| number_error(name, value))?,
                );
            }
            "namespace" => self.namespace = entrega_core::Namespace::new(value)?,
            _ => self.overrides.push((name.to_owned(), value.to_owned())),
        }
        Ok(())
    }

    /// Sets [`KafkaConfig::namespace`].
    pub fn with_namespace(mut self, namespace: entrega_core::Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// Names the broker knows for `records`' topics turned back into the names callers gave.
    pub(crate) fn localize(&self, records: &mut [entrega_core::Record]) {
        if self.namespace.is_none() {
            return;
        }
        for r in records {
            r.topic = self.namespace.local(&r.topic).to_owned();
        }
    }

    /// The topic of each message of `batch` as the broker knows it: borrowed without a
    /// namespace, the namespaced name with one (the messages themselves are not copied).
    pub(crate) fn wire_topics<'a>(
        &self,
        batch: &'a [entrega_core::OutgoingMessage],
    ) -> Vec<std::borrow::Cow<'a, str>> {
        batch
            .iter()
            .map(|m| {
                if self.namespace.is_none() {
                    std::borrow::Cow::Borrowed(m.topic.as_str())
                } else {
                    std::borrow::Cow::Owned(self.namespace.wire(&m.topic))
                }
            })
            .collect()
    }

    /// Sets [`KafkaConfig::client_id`].
    pub fn with_client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = client_id.into();
        self
    }

    /// Sets [`KafkaConfig::session_timeout`].
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets [`KafkaConfig::delivery_timeout`].
    pub fn with_delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Sets [`KafkaConfig::request_timeout`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`KafkaConfig::replication_factor`].
    pub fn with_replication_factor(mut self, factor: u16) -> Self {
        self.replication_factor = Some(factor);
        self
    }

    /// Adds a librdkafka property, applied after every property this crate sets.
    pub fn with_override(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.overrides.push((name.into(), value.into()));
        self
    }

    /// Properties every client shares, without the overrides.
    fn base(&self, client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap)
            .set("client.id", client_id)
            // Never let a metadata request create a topic: publishing to a missing topic must
            // fail with `UnknownTopic`, and topics are made only through `TopicAdmin`.
            .set("allow.auto.create.topics", "false")
            // TCP keepalive probes on every broker connection, so a half-open one (a broker
            // gone without a FIN, a dropped NAT entry) is found and reconnected.
            .set("socket.keepalive.enable", "true");
        c
    }

    /// Applies the overrides that concern a client of this `role`: a property librdkafka
    /// knows to be only a producer's (or only a consumer's) is left out of the other
    /// clients, so that one URL can carry both kinds without warnings from every client.
    fn finish(&self, mut c: ClientConfig, role: Role) -> ClientConfig {
        for (name, value) in &self.overrides {
            if role.takes(name) {
                c.set(name, value);
            }
        }
        c
    }

    /// The idempotent producer's properties.
    pub(crate) fn producer(&self) -> ClientConfig {
        let mut c = self.base(&self.client_id);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("max.in.flight.requests.per.connection", "5")
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", ms(self.delivery_timeout));
        self.finish(c, Role::Producer)
    }

    /// The transactional producer of a [`crate::KafkaTransformer`]: the idempotent
    /// producer's properties plus its `transactional.id`.
    pub(crate) fn transactional_producer(
        &self,
        transactional_id: &str,
        timeout: Duration,
    ) -> ClientConfig {
        let mut c = self.producer();
        // librdkafka refuses a message that may outlive its transaction.
        c.set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", ms(timeout))
            .set("message.timeout.ms", ms(self.delivery_timeout.min(timeout)));
        self.finish(c, Role::Producer)
    }

    /// The consumer of a [`crate::KafkaTransformer`]: a group member that reads only
    /// committed transactions; its offsets are committed by the producer's transactions.
    pub(crate) fn transform_consumer(&self, group: &str, member: &str) -> ClientConfig {
        let mut c = self.member(group, member);
        c.set("isolation.level", "read_committed");
        c
    }

    /// A group member's properties.
    pub(crate) fn member(&self, group: &str, member: &str) -> ClientConfig {
        let mut c = self.consumer(group, member);
        c.set("partition.assignment.strategy", "cooperative-sticky");
        self.finish(c, Role::Consumer)
    }

    /// A client that reads offsets or records of `group` without ever joining it.
    pub(crate) fn reader(&self, group: &str) -> ClientConfig {
        let mut c = self.consumer(group, &self.client_id);
        // A scan reads up to a partition's end, where a fetch finds nothing and the broker
        // holds it for `fetch.wait.max.ms` (500 ms by default) before answering: once per
        // partition read. The inspector wants the answer, not the wait.
        c.set("fetch.wait.max.ms", "10");
        self.finish(c, Role::Consumer)
    }

    fn consumer(&self, group: &str, client_id: &str) -> ClientConfig {
        let mut c = self.base(client_id);
        let session = self.session_timeout.as_millis().max(1);
        // Heartbeat often enough to learn of a rebalance quickly, and within the session.
        let heartbeat = (session / 5).clamp(1, 3_000);
        c.set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", heartbeat.to_string());
        c
    }

    /// The admin client's properties.
    pub(crate) fn admin(&self) -> ClientConfig {
        let c = self.base(&self.client_id);
        self.finish(c, Role::Admin)
    }
}

fn strip_scheme(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    scheme.eq_ignore_ascii_case("kafka").then_some(rest)
}

fn parse_brokers(list: &str) -> Result<String, KafkaUrlError> {
    let mut out = Vec::new();
    for broker in list.split(',') {
        if broker.is_empty() {
            continue;
        }
        let (host, port) = broker
            .rsplit_once(':')
            .filter(|(h, _)| valid_host(h))
            .ok_or_else(|| KafkaUrlError::Broker {
                broker: broker.to_owned(),
            })?;
        match port.parse::<u16>() {
            Ok(p) if p > 0 => out.push(format!("{host}:{p}")),
            _ => {
                return Err(KafkaUrlError::Port {
                    broker: broker.to_owned(),
                })
            }
        }
    }
    if out.is_empty() {
        return Err(KafkaUrlError::NoBrokers);
    }
    Ok(out.join(","))
}

fn valid_host(host: &str) -> bool {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !inner.is_empty() && inner.chars().all(|c| c.is_ascii_hexdigit() || c == ':');
    }
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
}

fn millis(name: &str, value: &str) -> Result<Duration, KafkaUrlError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| number_error(name, value))
}

fn number_error(name: &str, value: &str) -> KafkaUrlError {
    KafkaUrlError::Number {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_brokers_and_parameters() {
        let c = KafkaConfig::from_url(
            "kafka://a.example:9092,10.0.0.2:9093/?session_timeout_ms=7000&delivery_timeout_ms=5000\
             &client_id=km0&replication_factor=3&max.poll.interval.ms=10000",
        )
        .unwrap();
        assert_eq!(c.bootstrap, "a.example:9092,10.0.0.2:9093");
        assert_eq!(c.session_timeout, Duration::from_secs(7));
        assert_eq!(c.delivery_timeout, Duration::from_secs(5));
        assert_eq!(c.client_id, "km0");
        assert_eq!(c.replication_factor, Some(3));
        assert_eq!(
            c.overrides,
            vec![("max.poll.interval.ms".to_owned(), "10000".to_owned())]
        );
        let member = c.member("g", "m");
        assert_eq!(member.get("max.poll.interval.ms"), Some("10000"));
        assert_eq!(member.get("session.timeout.ms"), Some("7000"));
        assert_eq!(member.get("client.id"), Some("m"));
    }

    #[test]
    fn a_cluster_gets_a_session_that_outlasts_a_brokers_fencing() {
        let one = KafkaConfig::from_url("kafka://127.0.0.1:9092").unwrap();
        assert_eq!(one.session_timeout, SINGLE_BROKER_SESSION_TIMEOUT);
        let three = KafkaConfig::from_url("kafka://h1:9092,h2:9092,h3:9092").unwrap();
        assert_eq!(three.session_timeout, CLUSTER_SESSION_TIMEOUT);
        assert_eq!(
            three.member("g", "m").get("session.timeout.ms"),
            Some("15000")
        );
        let set = KafkaConfig::from_url("kafka://h1:9092,h2:9092?session_timeout_ms=6000").unwrap();
        assert_eq!(set.session_timeout, Duration::from_secs(6));
    }

    #[test]
    fn every_client_probes_its_connections() {
        let c = KafkaConfig::new("127.0.0.1:9092");
        for client in [c.member("g", "m"), c.producer(), c.admin()] {
            assert_eq!(client.get("socket.keepalive.enable"), Some("true"));
        }
    }

    #[test]
    fn defaults_without_query() {
        let c = KafkaConfig::from_url("KAFKA://127.0.0.1:9092").unwrap();
        assert_eq!(c, KafkaConfig::new("127.0.0.1:9092"));
        assert_eq!(c.client_id, "entrega");
        assert_eq!(c.session_timeout, Duration::from_secs(6));
        assert_eq!(c.delivery_timeout, Duration::from_secs(30));
        let ipv6 = KafkaConfig::from_url("kafka://[::1]:9092").unwrap();
        assert_eq!(ipv6.bootstrap, "[::1]:9092");
    }

    #[test]
    fn overrides_reach_only_the_clients_they_concern() {
        let c = KafkaConfig::new("h:1")
            .with_override("linger.ms", "0")
            .with_override("fetch.wait.max.ms", "5")
            .with_override("socket.keepalive.enable", "true");
        let (producer, member, reader, admin) =
            (c.producer(), c.member("g", "m"), c.reader("g"), c.admin());
        assert_eq!(producer.get("linger.ms"), Some("0"));
        assert_eq!(producer.get("fetch.wait.max.ms"), None);
        assert_eq!(member.get("fetch.wait.max.ms"), Some("5"));
        assert_eq!(member.get("linger.ms"), None);
        assert_eq!(reader.get("fetch.wait.max.ms"), Some("5"));
        assert_eq!(admin.get("linger.ms"), None);
        assert_eq!(admin.get("fetch.wait.max.ms"), None);
        for client in [&producer, &member, &reader, &admin] {
            assert_eq!(client.get("socket.keepalive.enable"), Some("true"));
        }
    }

    #[test]
    fn overrides_win_over_crate_properties() {
        let c = KafkaConfig::new("h:1").with_override("acks", "1");
        assert_eq!(c.producer().get("acks"), Some("1"));
        assert_eq!(c.producer().get("enable.idempotence"), Some("true"));
        assert_eq!(
            c.producer().get("partitioner"),
            Some("murmur2_random"),
            "keys must land where partition_for says"
        );
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("postgres://h:1", "Scheme"),
            ("127.0.0.1:9092", "Scheme"),
            ("kafka://", "NoBrokers"),
            ("kafka://?a=b", "NoBrokers"),
            ("kafka://host", "Broker"),
            ("kafka://:9092", "Broker"),
            ("kafka://ho st:9092", "Broker"),
            ("kafka://host:port", "Port"),
            ("kafka://host:0", "Port"),
            ("kafka://host:70000", "Port"),
            ("kafka://host:1/topic", "Path"),
            ("kafka://host:1?novalue", "Param"),
            ("kafka://host:1?=v", "Param"),
            ("kafka://host:1?session_timeout_ms=abc", "Number"),
            ("kafka://host:1?delivery_timeout_ms=0", "Number"),
            ("kafka://host:1?replication_factor=-1", "Number"),
            ("kafka://host:1?namespace=a/b", "Namespace"),
            ("kafka://host:1?namespace=", "Namespace"),
        ];
        for (url, want) in cases {
            let err = KafkaConfig::from_url(url).unwrap_err();
            let got = format!("{err:?}");
            assert!(got.starts_with(want), "{url}: {got}");
            assert!(!err.to_string().is_empty());
        }
        let scoped = KafkaConfig::from_url("kafka://host:1?namespace=demo-1.").unwrap();
        assert_eq!(scoped.namespace.prefix(), "demo-1.");
        assert!(scoped.overrides.is_empty(), "not a librdkafka property");
        let err = KafkaConfig::from_url("kafka://host:x").unwrap_err();
        assert_eq!(
            err,
            KafkaUrlError::Port {
                broker: "host:x".into()
            }
        );
    }
}
