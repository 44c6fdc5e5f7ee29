//! The connection to RabbitMQ: opened on first use with a timeout, and opened again after it
//! fails, with a capped, jittered backoff between attempts.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega_core::{LogInspector, Publisher, SideQueues, Subscriber, TopicAdmin, TransportError};
use lapin::{Channel, Connection, ConnectionProperties};
use rand::Rng as _;
use tokio::sync::Mutex;

use crate::admin::AmqpAdmin;
use crate::config::AmqpConfig;
use crate::error::classify;
use crate::inspector::AmqpInspector;
use crate::layout::{GroupQueues, GroupSpec, QueueLayout};
use crate::publisher::AmqpPublisher;
use crate::side::AmqpSideQueues;
use crate::subscription::AmqpSubscriber;

/// A RabbitMQ broker: its configuration and one shared connection; cheap to clone.
#[derive(Clone)]
pub struct Amqp {
    inner: Arc<Inner>,
}

struct Inner {
    config: AmqpConfig,
    state: Mutex<State>,
    /// Groups given their own names or layout, by (group, topic).
    groups: std::sync::RwLock<HashMap<(String, String), GroupSpec>>,
    /// What was named in the namespace, for [`Amqp::remove_namespace`].
    named: std::sync::Mutex<Named>,
}

/// Names used in a namespace by this handle, by the names callers gave.
#[derive(Default)]
struct Named {
    groups: BTreeSet<(String, String)>,
    exchanges: BTreeSet<String>,
    queues: BTreeSet<String>,
}

/// What [`Amqp::remove_namespace`] removed, as the broker knew it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemovedNames {
    /// Consumer groups whose queues and exchanges were deleted (their base names).
    pub groups: Vec<String>,
    /// Other queues deleted (request and durable reply queues).
    pub queues: Vec<String>,
    /// Exchanges deleted (topics, presence, dead letters).
    pub exchanges: Vec<String>,
}

/// The kind of name [`Amqp::wire`] is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Exchange,
    Queue,
}

#[derive(Default)]
struct State {
    connection: Option<Connection>,
    /// Failed attempts in a row.
    failures: u32,
    /// No new attempt before this.
    not_before: Option<Instant>,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("prefetch", &self.inner.config.prefetch)
            .finish_non_exhaustive()
    }
}

impl Amqp {
    /// A handle on the broker of `config`; the connection opens on first use.
    pub fn connect(config: AmqpConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(State::default()),
                groups: std::sync::RwLock::default(),
                named: std::sync::Mutex::default(),
            }),
        }
    }

    /// Gives group `group`'s queues on `topic` their own base name or layout (e.g. the seed's
    /// `inventario.pedidos`, shared). Set it before the group subscribes, the same on every
    /// process of the group.
    pub fn set_group(&self, group: &str, topic: &str, spec: GroupSpec) {
        let mut groups = self
            .inner
            .groups
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        groups.insert((group.to_owned(), topic.to_owned()), spec);
    }

    /// The name the broker knows for the exchange or queue `name`, under the namespace
    /// ([`AmqpConfig::namespace`]); remembered for [`Amqp::remove_namespace`]. The default
    /// exchange (`""`) and the broker's own names (`amq.*`, such as a server-named reply
    /// queue) are never prefixed.
    pub(crate) fn wire(&self, kind: Kind, name: &str) -> String {
        let ns = &self.inner.config.namespace;
        if ns.is_none() || name.is_empty() || name.starts_with("amq.") {
            return name.to_owned();
        }
        self.remember(|named| {
            let names = match kind {
                Kind::Exchange => &mut named.exchanges,
                Kind::Queue => &mut named.queues,
            };
            // Named once, looked up on every publish after.
            if !names.contains(name) {
                names.insert(name.to_owned());
            }
        });
        ns.wire(name)
    }

    /// The name callers know for the broker's `wire` name.
    pub(crate) fn local<'a>(&self, wire: &'a str) -> &'a str {
        self.inner.config.namespace.local(wire)
    }

    fn remember(&self, f: impl FnOnce(&mut Named)) {
        if self.inner.config.namespace.is_none() {
            return;
        }
        let mut named = self
            .inner
            .named
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut named);
    }

    /// Deletes every queue and exchange this handle named in its namespace (groups' queues
    /// with what they hold, request and reply queues, topic, presence and dead-letter
    /// exchanges), as a run that had the namespace to itself leaves the virtual host as it
    /// found it. Refused without a namespace.
    pub async fn remove_namespace(&self) -> Result<RemovedNames, TransportError> {
        if self.inner.config.namespace.is_none() {
            return Err(TransportError::Rejected {
                reason: "removing a namespace needs one".to_owned(),
            });
        }
        let named = std::mem::take(
            &mut *self
                .inner
                .named
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut removed = RemovedNames::default();
        for (group, topic) in &named.groups {
            let queues = self.group_queues(group, topic);
            self.delete_group(group, topic).await?;
            removed.groups.push(queues.base);
        }
        let ns = &self.inner.config.namespace;
        // Other handles (an earlier process of the same run) may have named more: the
        // management API lists the virtual host's names, when it answers.
        let listed = self.listed_names().await;
        let mut queues: BTreeSet<String> = named.queues.iter().map(|q| ns.wire(q)).collect();
        let mut exchanges: BTreeSet<String> = named.exchanges.iter().map(|e| ns.wire(e)).collect();
        queues.extend(listed.queues.into_iter().filter(|q| ns.owns(q)));
        exchanges.extend(listed.exchanges.into_iter().filter(|e| ns.owns(e)));
        let channel = self.channel().await?;
        for name in queues {
            crate::topology::delete_queue(&channel, &name).await?;
            removed.queues.push(name);
        }
        for name in exchanges {
            crate::topology::delete_exchange(&channel, &name).await?;
            removed.exchanges.push(name);
        }
        let _ = channel
            .close(200, "entrega: namespace removed".into())
            .await;
        Ok(removed)
    }

    /// The names and shape of group `group`'s queues on `topic`.
    pub fn group_queues(&self, group: &str, topic: &str) -> GroupQueues {
        self.remember(|named| {
            named.groups.insert((group.to_owned(), topic.to_owned()));
        });
        let config = &self.inner.config;
        let ns = &config.namespace;
        let groups = self
            .inner
            .groups
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let spec = groups.get(&(group.to_owned(), topic.to_owned()));
        let layout = spec.map_or(config.layout, |s| s.layout);
        GroupQueues {
            topic: self.wire(Kind::Exchange, topic),
            base: ns.wire(
                &spec
                    .and_then(|s| s.base.clone())
                    .unwrap_or_else(|| format!("{group}.{topic}")),
            ),
            layout,
            shards: match layout {
                QueueLayout::Shared => 1,
                QueueLayout::Sharded => config.shards.max(1),
            },
            dead_letter_exchange: self.wire(Kind::Exchange, &config.dead_letter_exchange),
            delivery_limit: config.delivery_limit,
            replicated: config.replicated,
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &AmqpConfig {
        &self.inner.config
    }

    /// Publishing side.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(AmqpPublisher::new(self.clone()))
    }

    /// Consuming side: groups of [`AmqpConfig::shards`] shard queues per topic.
    pub fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(AmqpSubscriber::new(self.clone()))
    }

    /// What a log inspector can learn here: nothing, and why ([`AmqpInspector`]).
    pub fn inspector(&self) -> Arc<dyn LogInspector> {
        Arc::new(AmqpInspector)
    }

    /// Topic creation.
    pub fn admin(&self) -> Arc<dyn TopicAdmin> {
        Arc::new(AmqpAdmin::new(self.clone()))
    }

    /// A new channel on the live connection, connecting first when there is none (or it
    /// failed). While attempts keep failing, the next one waits a doubling, jittered delay
    /// (`reconnect_base` up to `reconnect_max`); a call in that window fails at once as
    /// unavailable rather than hammering the broker.
    pub(crate) async fn channel(&self) -> Result<Channel, TransportError> {
        let config = &self.inner.config;
        let mut state = self.inner.state.lock().await;
        if let Some(connection) = &state.connection {
            if connection.status().connected() {
                match connection.create_channel().await {
                    Ok(channel) => return Ok(channel),
                    Err(e) => {
                        tracing::warn!(error = %e, "opening an AMQP channel failed; reconnecting");
                        state.connection = None;
                    }
                }
            } else {
                state.connection = None;
            }
        }
        if let Some(not_before) = state.not_before {
            if Instant::now() < not_before {
                return Err(TransportError::unavailable(format!(
                    "RabbitMQ unreachable: {} failed connection attempts, next in {} ms",
                    state.failures,
                    not_before
                        .saturating_duration_since(Instant::now())
                        .as_millis()
                )));
            }
        }
        let attempt = async {
            let connection = open(config).await?;
            let channel = connection.create_channel().await.map_err(classify)?;
            Ok::<_, TransportError>((connection, channel))
        };
        let nodes = u32::try_from(config.uris.len().max(1)).unwrap_or(u32::MAX);
        match tokio::time::timeout(config.connect_timeout.saturating_mul(nodes), attempt).await {
            Ok(Ok((connection, channel))) => {
                if state.failures > 0 {
                    tracing::info!(failures = state.failures, "connected to RabbitMQ again");
                }
                state.connection = Some(connection);
                state.failures = 0;
                state.not_before = None;
                Ok(channel)
            }
            outcome => {
                state.failures = state.failures.saturating_add(1);
                let delay = backoff(config, state.failures);
                state.not_before = Some(Instant::now() + delay);
                Err(match outcome {
                    Ok(Err(e)) => e,
                    _ => TransportError::unavailable(format!(
                        "connecting to RabbitMQ took more than {} ms",
                        config.connect_timeout.as_millis()
                    )),
                })
            }
        }
    }

    /// Declares group `group`'s queues on `topic` (and the topic): what a publisher needs
    /// before it publishes, since a message no queue takes is refused. Idempotent.
    pub async fn declare_group(&self, group: &str, topic: &str) -> Result<(), TransportError> {
        let channel = self.channel().await?;
        let declared =
            crate::topology::declare_group(&channel, &self.group_queues(group, topic)).await;
        let _ = channel.close(200, "entrega: declared".into()).await;
        declared
    }

    /// Request and reply queues ([`AmqpRpc`](crate::AmqpRpc)).
    pub fn rpc(&self) -> Arc<dyn entrega_core::RpcTransport> {
        Arc::new(crate::rpc::AmqpRpc::new(self.clone()))
    }

    /// Dead letters and delayed retries in the group's own queues ([`AmqpSideQueues`]).
    pub fn side_queues(&self) -> Arc<dyn SideQueues> {
        Arc::new(AmqpSideQueues::new(self.clone()))
    }

    /// Deletes consumer group `group`'s queues on `topic`, messages included, and its
    /// exchanges (see [`crate::topology::delete_group`]).
    pub async fn delete_group(&self, group: &str, topic: &str) -> Result<(), TransportError> {
        let channel = self.channel().await?;
        let deleted =
            crate::topology::delete_group(&channel, &self.group_queues(group, topic)).await;
        let _ = channel.close(200, "entrega: deleted".into()).await;
        deleted
    }
}

/// The wait after `failures` failed attempts in a row: `base * 2^(failures-1)` capped at
/// `max`, less up to a fifth at random so reconnecting clients do not move in step.
fn backoff(config: &AmqpConfig, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    let full = config
        .reconnect_base
        .saturating_mul(1u32 << exp)
        .min(config.reconnect_max);
    let cut = rand::thread_rng().gen_range(0.0..0.2);
    full.mul_f64(1.0 - cut)
}

/// A connection to `config`'s broker, to the first of its nodes that accepts one: over TLS
/// for `amqps://`, trusting `config.tls_ca` too when given (an unreadable file is refused, not
/// retried).
async fn open(config: &AmqpConfig) -> Result<Connection, TransportError> {
    let tls = match &config.tls_ca {
        Some(path) => lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: Some(std::fs::read_to_string(path).map_err(|e| {
                TransportError::Rejected {
                    reason: format!("reading the certificate authority {}: {e}", path.display()),
                }
            })?),
        },
        None => lapin::tcp::OwnedTLSConfig::default(),
    };
    // Each node the URL names, in turn: the first that accepts serves.
    let mut last = None;
    for uri in config
        .uris
        .iter()
        .chain(config.uris.is_empty().then_some(&config.uri))
    {
        let runtime = lapin::runtime::default_runtime().map_err(classify)?;
        let connect = Connection::connect_with_config(
            uri,
            ConnectionProperties::default(),
            tls.clone(),
            runtime,
        );
        // Each node gets the whole connect timeout: one that hangs must not use up the others'.
        let connected = match tokio::time::timeout(config.connect_timeout, connect).await {
            Ok(connected) => connected.map_err(classify),
            Err(_) => Err(TransportError::unavailable(format!(
                "no connection within {} ms",
                config.connect_timeout.as_millis()
            ))),
        };
        match connected {
            Ok(connection) => return Ok(connection),
            Err(e) => {
                if config.uris.len() > 1 {
                    tracing::debug!(node = %entrega_core::redact_url(uri), error = %e, "node refused; trying the next");
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| TransportError::Rejected {
        reason: "the AMQP URL names no node".to_owned(),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_waits_double_up_to_the_cap_with_jitter() {
        let config =
            AmqpConfig::from_url("amqp://h?reconnect_base_ms=100&reconnect_max_ms=1000").unwrap();
        let first = backoff(&config, 1);
        assert!(first <= Duration::from_millis(100) && first >= Duration::from_millis(80));
        let third = backoff(&config, 3);
        assert!(third <= Duration::from_millis(400) && third >= Duration::from_millis(320));
        let late = backoff(&config, 30);
        assert!(late <= Duration::from_millis(1000) && late >= Duration::from_millis(800));
    }
}
