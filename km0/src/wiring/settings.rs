//! A deployment's settings: how long leases and retained rows last, how consumers batch and
//! retry, whether orders run through the saga, TLS, HTTP limits, and whether opening a
//! database migrates it. Plain data, set from the command line before anything runs.

use std::path::PathBuf;
use std::time::Duration;

use super::config::RetryArgs;
use super::http_server::HttpLimits;
use super::tls::ServerTls;
use super::System;
use crate::services::pedidos::SagaTimings;

/// Lease period of relay lanes and consumer-group partitions unless told otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// How long published outbox rows and processed-message keys are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Published outbox rows older than this are purged by the relay.
    pub outbox: Duration,
    /// Keys in `mensajes_procesados` older than this are purged by the consumer. Must exceed
    /// the longest time a redelivery can arrive (the broker's retention), or a very late
    /// duplicate would be applied again.
    pub inbox: Duration,
}

impl Default for Retention {
    /// One day of published outbox rows; 14 days of keys, as the seed suggests.
    fn default() -> Self {
        Self {
            outbox: Duration::from_secs(24 * 3600),
            inbox: Duration::from_secs(14 * 24 * 3600),
        }
    }
}

/// Whether a deployment's processes create and migrate the databases they open, or expect
/// them created and migrated already (by `km0 migrate`, run as their owner) and only read and
/// write rows, as a least-privileged role can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaMode {
    /// Create missing databases and apply pending migrations on opening (the embedded
    /// default, the demo, `km0 migrate`, tests).
    #[default]
    Migrate,
    /// Open existing databases only; one whose schema is behind this build is an error that
    /// names `km0 migrate`.
    Expect,
}

/// The settings of one deployment.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) lease_ttl: Duration,
    pub(super) retention: Retention,
    pub(super) key_concurrency: usize,
    pub(super) max_batch: usize,
    pub(super) retry: RetryArgs,
    pub(super) saga: Option<SagaTimings>,
    pub(super) replay_key: Option<entrega_core::ReplayKey>,
    pub(super) transitions: entrega::Transitions,
    pub(super) cloudevents: bool,
    pub(super) http_limits: HttpLimits,
    pub(super) schema: SchemaMode,
    pub(super) http_tls: Option<ServerTls>,
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) delivery_time: Option<Duration>,
    pub(super) relay_source: super::relay::RelaySource,
    pub(super) recreate_slot: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease_ttl: DEFAULT_LEASE_TTL,
            retention: Retention::default(),
            key_concurrency: 1,
            max_batch: entrega::DEFAULT_MAX_BATCH,
            retry: RetryArgs::default(),
            saga: None,
            replay_key: None,
            transitions: entrega::Transitions::new(),
            cloudevents: false,
            http_limits: HttpLimits::default(),
            schema: SchemaMode::default(),
            http_tls: None,
            tls_ca: None,
            delivery_time: None,
            relay_source: super::relay::RelaySource::Poll,
            recreate_slot: false,
        }
    }
}

impl System {
    /// Runs every new order through the order saga, with `timings` (pedidos orchestrates it).
    pub fn with_saga(mut self, timings: SagaTimings) -> Self {
        self.settings.saga = Some(timings);
        self
    }

    /// The order saga's timings, when orders run through it.
    pub fn saga(&self) -> Option<SagaTimings> {
        self.settings.saga
    }

    /// Sets the operators' replay key: `km0 dlq replay --group` signs with it, and the
    /// consumers obey `entrega-only-group` only when it verifies.
    pub fn with_replay_key(mut self, key: entrega_core::ReplayKey) -> Self {
        self.settings.replay_key = Some(key);
        self
    }

    /// The operators' replay key, if one is set.
    pub fn replay_key(&self) -> Option<&entrega_core::ReplayKey> {
        self.settings.replay_key.as_ref()
    }

    /// Publishes the event types `transitions` names at both versions (each relay).
    pub fn with_transitions(mut self, transitions: entrega::Transitions) -> Self {
        self.settings.transitions = transitions;
        self
    }

    /// The event types published at both versions.
    pub fn transitions(&self) -> &entrega::Transitions {
        &self.settings.transitions
    }

    /// Publishes every event with its CloudEvents attributes (binary content mode: `ce_*`
    /// headers on Kafka and the embedded log, `cloudEvents:*` on RabbitMQ).
    pub fn with_cloudevents(mut self, on: bool) -> Self {
        self.settings.cloudevents = on;
        self
    }

    /// Whether events carry their CloudEvents attributes.
    pub fn cloudevents(&self) -> bool {
        self.settings.cloudevents
    }

    /// Serves every HTTP server of the deployment over TLS with this certificate and key.
    pub fn with_http_tls(mut self, tls: ServerTls) -> Self {
        self.settings.http_tls = Some(tls);
        self
    }

    /// The acceptor of the deployment's HTTPS servers, when they serve TLS.
    pub fn http_tls(&self) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
        self.settings
            .http_tls
            .as_ref()
            .map(ServerTls::acceptor)
            .transpose()
    }

    /// Trusts the certificates in `ca` (PEM) for outgoing HTTPS, besides the public roots.
    pub fn with_tls_ca(mut self, ca: PathBuf) -> Self {
        self.settings.tls_ca = Some(ca);
        self
    }

    /// The extra certificate authority of outgoing HTTPS, if any.
    pub fn tls_ca(&self) -> Option<&std::path::Path> {
        self.settings.tls_ca.as_deref()
    }

    /// Sets whether opening a database migrates it ([`SchemaMode`]).
    pub fn with_schema(mut self, schema: SchemaMode) -> Self {
        self.settings.schema = schema;
        self
    }

    /// Whether opening a database migrates it.
    pub fn schema(&self) -> SchemaMode {
        self.settings.schema
    }

    /// Sets the limits of every HTTP server the deployment runs.
    pub fn with_http_limits(mut self, limits: HttpLimits) -> Self {
        self.settings.http_limits = limits;
        self
    }

    /// The limits of every HTTP server the deployment runs.
    pub fn http_limits(&self) -> HttpLimits {
        self.settings.http_limits
    }

    /// Sets how the consumers retry (strategy, attempts, backoff).
    pub fn with_retry(mut self, retry: RetryArgs) -> Self {
        self.settings.retry = retry;
        self
    }

    /// How the consumers retry.
    pub fn retry(&self) -> &RetryArgs {
        &self.settings.retry
    }

    /// Sets how long reparto's simulated couriers take to make a delivery once assigned (then
    /// they are free for the next); `None` (the default; `km0`'s command line sets 30 s):
    /// they never finish by themselves, something else marks deliveries made.
    pub fn with_delivery_time(mut self, delivery_time: Option<Duration>) -> Self {
        self.settings.delivery_time = delivery_time;
        self
    }

    /// How long reparto's simulated couriers take to make a delivery, if they make them.
    pub fn delivery_time(&self) -> Option<Duration> {
        self.settings.delivery_time
    }

    /// Sets how many keys' events the inventario worker applies at once (1: one batch at a
    /// time, in offset order per partition).
    pub fn with_key_concurrency(mut self, key_concurrency: usize) -> Self {
        self.settings.key_concurrency = key_concurrency.max(1);
        self
    }

    /// How many keys' events the inventario worker applies at once.
    pub fn key_concurrency(&self) -> usize {
        self.settings.key_concurrency
    }

    /// Sets the most records a consumer takes per poll, which is also its transaction's
    /// size (inventario applies a whole poll in a constant number of statements).
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        self.settings.max_batch = max_batch.max(1);
        self
    }

    /// The most records a consumer takes per poll.
    pub fn max_batch(&self) -> usize {
        self.settings.max_batch
    }

    /// Sets how long published outbox rows and processed-message keys are kept.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.settings.retention = retention;
        self
    }

    /// How long published outbox rows and processed-message keys are kept.
    pub fn retention(&self) -> Retention {
        self.settings.retention
    }

    /// Where the relays read the outbox.
    pub fn with_relay_source(mut self, source: super::relay::RelaySource) -> Self {
        self.settings.relay_source = source;
        self
    }

    /// Where the relays read the outbox.
    pub fn relay_source(&self) -> super::relay::RelaySource {
        self.settings.relay_source
    }

    /// WAL relays create their slot again when it was dropped or lost (the deliberate
    /// recovery, after the polling relay published what was left).
    pub fn with_recreate_slot(mut self, on: bool) -> Self {
        self.settings.recreate_slot = on;
        self
    }

    /// Whether WAL relays create their slot again when it was dropped or lost.
    pub fn recreate_slot(&self) -> bool {
        self.settings.recreate_slot
    }

    /// Sets how long relay lanes and consumer partitions stay with a silent instance before
    /// others take them over (short in crash tests).
    pub fn with_lease_ttl(mut self, lease_ttl: Duration) -> Self {
        self.settings.lease_ttl = lease_ttl;
        self
    }

    /// Lease period of relay lanes and consumer partitions.
    pub fn lease_ttl(&self) -> Duration {
        self.settings.lease_ttl
    }
}
