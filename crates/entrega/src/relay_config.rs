//! How a relay is wired and tuned: its outbox ports, topic routing and timings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entrega_core::{LaneLeases, OutboxMaintenance, OutboxReader, OutboxWakeup};

use crate::backoff::Backoff;

/// The four outbox capabilities a relay works through.
#[derive(Clone)]
pub struct OutboxPorts {
    /// Lane ownership.
    pub leases: Arc<dyn LaneLeases>,
    /// Pending rows and marking.
    pub reader: Arc<dyn OutboxReader>,
    /// Purging published rows.
    pub maintenance: Arc<dyn OutboxMaintenance>,
    /// Wake-up after commits.
    pub wakeup: Arc<dyn OutboxWakeup>,
}

impl OutboxPorts {
    /// All four ports from one outbox implementation (such as [`crate::Db::outbox`]'s).
    pub fn new<T>(outbox: Arc<T>) -> Self
    where
        T: LaneLeases + OutboxReader + OutboxMaintenance + OutboxWakeup + 'static,
    {
        Self {
            leases: outbox.clone(),
            reader: outbox.clone(),
            maintenance: outbox.clone(),
            wakeup: outbox,
        }
    }
}

impl std::fmt::Debug for OutboxPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPorts").finish_non_exhaustive()
    }
}

/// Which topic the events of each aggregate type go to, as the application says: no topic
/// is assumed. A row whose aggregate has no route is refused like a row the transport
/// refuses (retried with backoff, then held for an operator), never sent somewhere else.
///
/// ```
/// use entrega::TopicRouting;
///
/// let routing = TopicRouting::new()
///     .route("pedido", "pedidos.eventos")
///     .otherwise("{aggregate}s.eventos");
/// assert_eq!(routing.topic_for("pedido").as_deref(), Some("pedidos.eventos"));
/// assert_eq!(routing.topic_for("pago").as_deref(), Some("pagos.eventos"));
/// assert_eq!(TopicRouting::new().topic_for("pago"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicRouting {
    routes: HashMap<String, String>,
    otherwise: Option<String>,
}

impl TopicRouting {
    /// No routes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends the events of `aggregate` to `topic`.
    pub fn route(mut self, aggregate: impl Into<String>, topic: impl Into<String>) -> Self {
        self.routes.insert(aggregate.into(), topic.into());
        self
    }

    /// Sends the events of every aggregate without a route of its own to `pattern`, with
    /// `{aggregate}` replaced by the aggregate type.
    pub fn otherwise(mut self, pattern: impl Into<String>) -> Self {
        self.otherwise = Some(pattern.into());
        self
    }

    /// The topic of `aggregate`; `None` when nothing routes it.
    pub fn topic_for(&self, aggregate: &str) -> Option<String> {
        self.routes.get(aggregate).cloned().or_else(|| {
            self.otherwise
                .as_ref()
                .map(|pattern| pattern.replace("{aggregate}", aggregate))
        })
    }
}

/// Settings of one relay instance.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Name of this instance among the relays of one outbox (lease owner), unique among those
    /// running. Kept across restarts (a host or pod name), it lets a restarted relay take its
    /// lanes back at once instead of waiting out its earlier life's leases; the default is a
    /// random name.
    pub instance_id: String,
    /// Producing service, written as the envelope's `origen`.
    pub source: String,
    /// Aggregate type to topic.
    pub routing: TopicRouting,
    /// Rows read and published per lane per batch.
    pub batch_size: usize,
    /// Lane lease period; lanes are renewed every third of it.
    pub lease_ttl: Duration,
    /// Longest idle wait when no wake-up arrives (writes from other processes).
    pub poll_interval: Duration,
    /// Published rows are kept this long, then purged.
    pub retention: Duration,
    /// How often to purge.
    pub purge_interval: Duration,
    /// Delays after failed publishes of a lane, and after store failures; also the delays
    /// before a row the transport refused is tried again (by its attempt count).
    pub backoff: Backoff,
    /// Attempts the transport may refuse a row before it is held for an operator
    /// (`km0 outbox release`); its aggregate waits meanwhile. At least 1.
    pub max_attempts: u32,
    /// Event types also published at an older version during a transition: each row of
    /// one goes out as the older version first, then as its own, with one `id_evento`
    /// ([`entrega_contracts::transition`]). None by default.
    pub transitions: entrega_contracts::Transitions,
    /// Publishes with the CloudEvents attributes of the transport's binding (binary content
    /// mode, [`crate::cloudevents`]). None by default.
    pub cloudevents: Option<crate::cloudevents::CloudEvents>,
}

impl RelayConfig {
    /// Defaults for a service named `source` publishing by `routing`: a random instance id,
    /// batches of 100, 10 s leases, 1 s polling fallback, one day of retention purged every 10 min,
    /// backoff from 100 ms to 30 s, a refused row held at its 5th refusal.
    pub fn new(source: impl Into<String>, routing: TopicRouting) -> Self {
        let source = source.into();
        Self {
            instance_id: format!("{source}-relay-{}", uuid::Uuid::new_v4().simple()),
            source,
            routing,
            batch_size: 100,
            lease_ttl: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            retention: Duration::from_secs(24 * 3600),
            purge_interval: Duration::from_secs(600),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)),
            max_attempts: 5,
            transitions: entrega_contracts::Transitions::new(),
            cloudevents: None,
        }
    }

    /// Publishes the event types `transitions` names at both versions.
    pub fn with_transitions(mut self, transitions: entrega_contracts::Transitions) -> Self {
        self.transitions = transitions;
        self
    }
}

/// Counters of a relay, shared with whoever holds the `Arc` (metrics, tests).
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Events published and marked.
    pub published: AtomicU64,
    /// Batches published and marked.
    pub batches: AtomicU64,
    /// Publishes that failed (nothing marked).
    pub publish_errors: AtomicU64,
    /// Lanes dropped because their lease was lost.
    pub leases_lost: AtomicU64,
    /// Published rows purged.
    pub purged: AtomicU64,
    /// Refusals recorded: rows the transport refused for good, one per refused attempt.
    pub refused: AtomicU64,
    /// Rows held after their last allowed attempt was refused.
    pub held: AtomicU64,
}

impl RelayStats {
    /// Events published and marked so far.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Batches published and marked so far.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Failed publishes so far.
    pub fn publish_errors(&self) -> u64 {
        self.publish_errors.load(Ordering::Relaxed)
    }

    /// Lanes dropped so far because their lease was lost.
    pub fn leases_lost(&self) -> u64 {
        self.leases_lost.load(Ordering::Relaxed)
    }

    /// Refusals recorded so far (one per refused attempt of a row).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Rows held so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_explicit_and_the_fallback_is_the_applications() {
        let routing = TopicRouting::new().route("pedido", "pedidos.eventos");
        assert_eq!(
            routing.topic_for("pedido").as_deref(),
            Some("pedidos.eventos")
        );
        assert_eq!(routing.topic_for("pago"), None);
        let routing = routing.otherwise("{aggregate}.v1").route("pago", "cobros");
        assert_eq!(routing.topic_for("pago").as_deref(), Some("cobros"));
        assert_eq!(routing.topic_for("factura").as_deref(), Some("factura.v1"));
    }
}
