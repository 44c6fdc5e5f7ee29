//! The consumer worker: reads a topic as a member of a consumer group, hands each event to its
//! handler, and turns every delivery into exactly one outcome.
//!
//! - `Ok` → **ack**: the offset advances.
//! - permanent error, malformed envelope, unknown `tipo` → **dead letter**: the original
//!   payload goes to `<topic>.dlq` with headers `intentos`, `motivo` and the origin headers;
//!   the offset advances only once that publish is confirmed. A dead letter the broker
//!   refuses for good (too large, its topic missing) or for too long is held in the
//!   consumer's database instead ([`Worker::with_held_letters`]), so the partition goes on.
//! - transient error (a panic, a handler past its timeout) → **retry**, by the subscription's
//!   [`RetryStrategy`]: in place (the partition is rewound to the message and paused for the
//!   backoff; later messages of that partition wait), through `<topic>.retry` (the partition
//!   goes on; the message comes back once its `no_antes` has passed), through the broker's
//!   delay queues (RabbitMQ: the message waits in a TTL queue and comes back into the group's
//!   queue with `intentos`), or ordered (the key is
//!   parked with its later messages while other keys go on); after `max_attempts` attempts it
//!   becomes a dead letter.
//!
//! Offsets are committed after the outcomes of a poll are final, i.e. after the handlers'
//! transactions committed, so a crash redelivers (at-least-once) and never skips.
//!
//! With [`WorkerConfig::key_concurrency`] above 1, the records of a poll run as per-key
//! chains, several at once: two messages of one key never run at the same time and always in
//! offset order, and a partition commits only up to its lowest unfinished message.

mod chains;
mod dead_letter;
mod decision;
mod divert;
mod held;
mod item;
mod keyed;
mod panics;
mod parked;
mod retry;
mod router;
mod session;
mod stats;
mod tracker;

use std::sync::Arc;
use std::time::Duration;

use entrega_core::{
    Clock, HeldLetterStore, Limits, ParkingStore, Publisher, ReplayKey, SideQueues, Subscriber,
    Subscription, SystemClock, TopicAdmin, TransportError,
};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use retry::Role;
use session::Session;

pub use retry::RetryStrategy;
pub use router::{handle_each, Handler, Message, Router};
pub use stats::WorkerStats;

/// Records per poll by default. On a backlog a set-based handler amortises its transaction's
/// commit, and the broker's offset commit, over the whole poll: inventario's throughput
/// levels off from about this size on PostgreSQL's log and on Kafka (docs/BENCHMARKS.md,
/// "The defaults on a backlog"). A poll returns what there is without waiting to fill, so a
/// quiet partition's latency does not depend on it.
pub const DEFAULT_MAX_BATCH: usize = 1_000;

/// Settings of one worker.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Consumer group (shares partitions and committed offsets).
    pub group: String,
    /// Topic to consume.
    pub topic: String,
    /// This member's name, unique among running members of the group.
    pub member: String,
    /// Attempts of a transiently failing message before it is dead-lettered.
    pub max_attempts: u32,
    /// Delay before each retry (base, cap and jitter).
    pub backoff: Backoff,
    /// Where a message waits for its next attempt; see [`RetryStrategy`].
    pub retry: RetryStrategy,
    /// Longest a handler call may run; past it the call is abandoned (its transaction rolls
    /// back when its future is dropped) and counts as a transient failure. `None`: no limit.
    pub handler_timeout: Option<Duration>,
    /// Most records taken per poll ([`DEFAULT_MAX_BATCH`] unless set). A poll returns what
    /// there is without waiting to fill, so a larger value costs a quiet partition nothing.
    pub max_batch: usize,
    /// Longest wait of one poll for new records.
    pub poll_wait: Duration,
    /// Size and depth limits for parsing envelopes.
    pub limits: Limits,
    /// Partitions of the dead-letter topic when the worker has to create it.
    pub dlq_partitions: u32,
    /// Partitions of the retry topic when the worker has to create it.
    pub retry_partitions: u32,
    /// How many keys' messages may be handled at once. `1` (the default, and what `0` means)
    /// handles a poll's records strictly in order, consecutive records of one handler as one
    /// batch. Above 1, records are split into chains by partition and key (records without a
    /// key stay serial within their partition); up to this many chains run at once, each in
    /// offset order and still batched. Handlers then run concurrently, interleaved on the
    /// worker's task, so they must tolerate concurrent calls.
    pub key_concurrency: usize,
    /// The operators' replay key: a record's `entrega-only-group` is obeyed only when its
    /// signature verifies with it. Without a key (or with a bad signature) the header is
    /// ignored and the record handled as any other.
    pub replay_key: Option<ReplayKey>,
}

impl WorkerConfig {
    /// Defaults for `group` on `topic`: a random member name, 3 attempts (as in the seed),
    /// backoff 1 s, 2 s, 4 s ... up to 60 s, retries in place, handler calls of at most 60 s,
    /// polls of up to [`DEFAULT_MAX_BATCH`] records waiting up to 500 ms, default envelope
    /// limits, one-partition dead-letter and retry topics, one key at a time.
    pub fn new(group: impl Into<String>, topic: impl Into<String>) -> Self {
        let group = group.into();
        let member = format!("{group}-{}", uuid::Uuid::new_v4().simple());
        Self {
            group,
            topic: topic.into(),
            member,
            max_attempts: 3,
            backoff: Backoff::default(),
            retry: RetryStrategy::InPlace,
            handler_timeout: Some(Duration::from_secs(60)),
            max_batch: DEFAULT_MAX_BATCH,
            poll_wait: Duration::from_millis(500),
            limits: Limits::default(),
            dlq_partitions: 1,
            retry_partitions: 1,
            key_concurrency: 1,
            replay_key: None,
        }
    }

    /// Sets [`WorkerConfig::key_concurrency`].
    pub fn with_key_concurrency(mut self, n: usize) -> Self {
        self.key_concurrency = n;
        self
    }

    /// Sets [`WorkerConfig::retry`].
    pub fn with_retry(mut self, strategy: RetryStrategy) -> Self {
        self.retry = strategy;
        self
    }

    /// The dead-letter topic: `<topic>.dlq`.
    pub fn dlq_topic(&self) -> String {
        format!("{}.dlq", self.topic)
    }

    /// The retry topic: `<topic>.retry`.
    pub fn retry_topic(&self) -> String {
        format!("{}.retry", self.topic)
    }
}

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// Subscribing, polling or leaving the group failed permanently.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// [`RetryStrategy::Ordered`] needs somewhere to park records: see
    /// [`Worker::with_parking`].
    #[error("ordered retries need a parking store")]
    NoParkingStore,
    /// [`RetryStrategy::DelayQueues`] needs the transport's delay queues: see
    /// [`Worker::with_side_queues`].
    #[error("retries through delay queues need a transport that has them (RabbitMQ)")]
    NoDelayQueues,
}

/// Consumes one topic for one group; see the module docs.
pub struct Worker {
    subscriber: Arc<dyn Subscriber>,
    publisher: Arc<dyn Publisher>,
    admin: Option<Arc<dyn TopicAdmin>>,
    parking: Option<Arc<dyn ParkingStore>>,
    held: Option<Arc<dyn HeldLetterStore>>,
    side: Option<Arc<dyn SideQueues>>,
    clock: Arc<dyn Clock>,
    router: Router,
    config: WorkerConfig,
    stats: Arc<WorkerStats>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("router", &self.router)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker reading through `subscriber`, publishing dead letters through `publisher`.
    pub fn new(
        subscriber: Arc<dyn Subscriber>,
        publisher: Arc<dyn Publisher>,
        router: Router,
        config: WorkerConfig,
    ) -> Self {
        Self {
            subscriber,
            publisher,
            admin: None,
            parking: None,
            held: None,
            side: None,
            clock: Arc::new(SystemClock),
            router,
            config,
            stats: Arc::default(),
        }
    }

    /// Lets the worker create the dead-letter topic when it does not exist yet.
    pub fn with_admin(mut self, admin: Arc<dyn TopicAdmin>) -> Self {
        self.admin = Some(admin);
        self
    }

    /// Where [`RetryStrategy::Ordered`] parks the records of a failed key: a store in the
    /// consumer's own database (`Db::parking`).
    pub fn with_parking(mut self, parking: Arc<dyn ParkingStore>) -> Self {
        self.parking = Some(parking);
        self
    }

    /// Where dead letters the broker refuses are held: a store in the consumer's own
    /// database ([`Db::held_letters`](crate::Db::held_letters)). Without one, such a letter
    /// is retried in place, and its partition waits.
    pub fn with_held_letters(mut self, held: Arc<dyn HeldLetterStore>) -> Self {
        self.held = Some(held);
        self
    }

    /// The transport's own dead-letter and delay queues (RabbitMQ's
    /// [`entrega_amqp::AmqpSideQueues`](https://docs.rs/entrega-amqp)): dead letters then go to
    /// the group's dead-letter queue instead of `<topic>.dlq`, and
    /// [`RetryStrategy::DelayQueues`] becomes available.
    pub fn with_side_queues(mut self, side: Arc<dyn SideQueues>) -> Self {
        self.side = Some(side);
        self
    }

    /// The clock behind `no_antes` and parking times (the system clock by default).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<WorkerStats> {
        Arc::clone(&self.stats)
    }

    /// The worker's settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Joins the group and consumes until `shutdown` is cancelled; then finishes the batch in
    /// flight, commits its offsets and leaves the group. Transient transport errors are
    /// retried with backoff; a permanent one (e.g. unknown topic) stops the worker.
    /// With [`RetryStrategy::RetryTopic`] the worker also consumes `<topic>.retry` (same
    /// group), creating it first when it may create topics.
    /// Run one `run` per `Worker` at a time: the member name is the worker's.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        match self.config.retry {
            RetryStrategy::InPlace => self.consume(Role::Source, &shutdown).await,
            RetryStrategy::Ordered if self.parking.is_none() => Err(WorkerError::NoParkingStore),
            RetryStrategy::Ordered => self.consume(Role::Source, &shutdown).await,
            RetryStrategy::DelayQueues if self.side.is_none() => Err(WorkerError::NoDelayQueues),
            RetryStrategy::DelayQueues => self.consume(Role::Source, &shutdown).await,
            RetryStrategy::RetryTopic => {
                if let Some(admin) = &self.admin {
                    let cfg = &self.config;
                    admin
                        .ensure_topic(&cfg.retry_topic(), cfg.retry_partitions)
                        .await?;
                }
                // One member leaving stops the other, so neither runs on alone unnoticed.
                let stop = shutdown.child_token();
                let (source, retries) = tokio::join!(
                    async {
                        let r = self.consume(Role::Source, &stop).await;
                        stop.cancel();
                        r
                    },
                    async {
                        let r = self.consume(Role::Retry, &stop).await;
                        stop.cancel();
                        r
                    }
                );
                source.and(retries)
            }
        }
    }

    /// Joins the group on `topic`, retrying transient errors (a database session ended, a
    /// broker restarting) with the worker's backoff; `None` when `shutdown` came first.
    async fn subscribe(
        &self,
        topic: &str,
        member: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Box<dyn Subscription>>, WorkerError> {
        let cfg = &self.config;
        let mut failures = 0u32;
        loop {
            let joined = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(None),
                joined = self.subscriber.subscribe(&cfg.group, topic, member) => joined,
            };
            match joined {
                Ok(sub) => return Ok(Some(sub)),
                Err(e) if e.is_transient() => {
                    failures = failures.saturating_add(1);
                    let delay = cfg.backoff.delay(failures);
                    tracing::warn!(error = %e, ?delay, topic, "joining the group failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(None),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One subscription's loop: the source topic, or its retry topic.
    async fn consume(&self, role: Role, shutdown: &CancellationToken) -> Result<(), WorkerError> {
        let cfg = &self.config;
        let (topic, member) = match role {
            Role::Source => (cfg.topic.clone(), cfg.member.clone()),
            Role::Retry => (cfg.retry_topic(), format!("{}.retry", cfg.member)),
        };
        let Some(sub) = self.subscribe(&topic, &member, shutdown).await? else {
            return Ok(());
        };
        let mut session = Session::new(self, sub, role);
        let mut failures = 0u32;
        let outcome = loop {
            let polled = tokio::select! {
                biased;
                () = shutdown.cancelled() => break Ok(()),
                polled = session.poll(cfg.max_batch, cfg.poll_wait) => polled,
            };
            match polled {
                Ok(records) => {
                    failures = 0;
                    // Not raced against the token: a batch in flight always finishes.
                    session.process(records).await;
                    session.commit().await;
                    session.drain_parked().await;
                }
                Err(e) if e.is_transient() => {
                    failures = failures.saturating_add(1);
                    let delay = cfg.backoff.delay(failures);
                    tracing::warn!(error = %e, ?delay, "poll failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(e) => break Err(e),
            }
        };
        session.commit().await;
        let closed = session.close().await;
        outcome?;
        match closed {
            // Leaving failed for now (the broker or the database is away): the member's
            // partitions go to the others once its lease or session expires.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "leaving the group failed; the lease will expire");
                Ok(())
            }
            closed => Ok(closed?),
        }
    }
}
