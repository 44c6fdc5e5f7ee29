//! What a backend provides so the conformance suites can run against it.
//!
//! Enqueueing into the outbox and claiming an inbox key are concrete, backend-typed functions
//! that take the caller's transaction, so no trait of `entrega-core` covers them. A backend's
//! `tests/conformance.rs` wraps them in the fixtures below; everything else the suites exercise
//! goes through the `entrega-core` traits themselves.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    Clock, DlqStore, LaneLeases, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
    ParkingStore, Publisher, Record, Subscriber, TopicAdmin,
};
use uuid::Uuid;

/// Any failure of a scenario or of the harness underneath it.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Result of a scenario: `Ok` when the backend conforms.
pub type Scenario = Result<(), BoxError>;

/// How a helper transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxEnd {
    /// The transaction commits.
    Commit,
    /// The transaction rolls back.
    Rollback,
}

/// Creates fresh, isolated outboxes (one database each).
#[async_trait]
pub trait OutboxHarness: Send + Sync {
    /// A new empty outbox with every migration it needs applied. Backends that read time from
    /// a clock (anything but the seed's own `DEFAULT now()` columns) must use `clock`.
    async fn outbox(&self, clock: Arc<dyn Clock>) -> Result<Box<dyn OutboxFixture>, BoxError>;
}

/// One outbox under test.
#[async_trait]
pub trait OutboxFixture: Send + Sync {
    /// Lane leases of this outbox.
    fn leases(&self) -> Arc<dyn LaneLeases>;
    /// Pending rows and marking.
    fn reader(&self) -> Arc<dyn OutboxReader>;
    /// Purge and status.
    fn maintenance(&self) -> Arc<dyn OutboxMaintenance>;
    /// Relay wake-up.
    fn wakeup(&self) -> Arc<dyn OutboxWakeup>;

    /// Enqueues `events` in one transaction through the backend's `enqueue_all`, then ends it.
    async fn enqueue(&self, events: &[NewEvent], end: TxEnd) -> Result<(), BoxError>;

    /// Enqueues `events` in a transaction that stays open until the returned handle commits
    /// (dropping the handle rolls it back). A backend whose writers are serialized (SQLite)
    /// may defer the insert to the commit: no other writer could have run in between anyway,
    /// so that is exactly what a late commit looks like there.
    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError>;

    /// The raw state of one outbox row, read with plain SQL; `None` when there is no such row.
    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError>;

    /// Number of rows in the outbox table, published or not.
    async fn row_count(&self) -> Result<u64, BoxError>;

    /// Drops the database, when the backend can.
    async fn teardown(self: Box<Self>) -> Result<(), BoxError>;
}

/// A transaction left open by [`OutboxFixture::enqueue_held`].
#[async_trait]
pub trait HeldTx: Send {
    /// Commits the transaction.
    async fn commit(self: Box<Self>) -> Result<(), BoxError>;
}

/// An outbox row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// The row's lane.
    pub lane: u32,
    /// The row's insertion sequence.
    pub seq: i64,
    /// Whether `publicado_en` is set.
    pub published: bool,
}

/// Creates fresh, isolated inboxes (idempotent-consumer key tables).
#[async_trait]
pub trait InboxHarness: Send + Sync {
    /// A new empty inbox with its migration applied.
    async fn inbox(&self) -> Result<Box<dyn InboxFixture>, BoxError>;
}

/// One inbox under test.
#[async_trait]
pub trait InboxFixture: Send + Sync {
    /// Claims `message_id` for `consumer` inside a transaction through the backend's `claim`,
    /// then ends it; returns what `claim` returned.
    async fn claim(&self, consumer: &str, message_id: &str, end: TxEnd) -> Result<bool, BoxError>;
    /// Keys recorded for `consumer`.
    async fn count(&self, consumer: &str) -> Result<u64, BoxError>;
    /// The backend's purge of keys older than `age`.
    async fn purge_older_than(&self, age: Duration) -> Result<u64, BoxError>;
    /// Moves the key's `procesado_en` `age` into the past, with plain SQL.
    async fn backdate(
        &self,
        consumer: &str,
        message_id: &str,
        age: Duration,
    ) -> Result<(), BoxError>;
    /// Drops the database, when the backend can.
    async fn teardown(self: Box<Self>) -> Result<(), BoxError>;
}

/// Creates fresh, isolated parking stores (ordered retries).
#[async_trait]
pub trait ParkingHarness: Send + Sync {
    /// A new empty parking store with its migration applied.
    async fn parking(&self) -> Result<Box<dyn ParkingFixture>, BoxError>;
}

/// One parking store under test.
#[async_trait]
pub trait ParkingFixture: Send + Sync {
    /// The store, through the `entrega-core` trait.
    fn store(&self) -> Arc<dyn ParkingStore>;
    /// Drops the database, when the backend can.
    async fn teardown(self: Box<Self>) -> Result<(), BoxError>;
}

/// Settings of a log under test; mirrors the fields of each backend's `LogConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// How long a member keeps its partitions without heartbeating.
    pub lease_ttl: Duration,
    /// Least time between two balancing rounds of one member.
    pub heartbeat: Duration,
    /// Fallback polling interval while waiting for data.
    pub poll_interval: Duration,
    /// Partition count of topics created on first publish; `None` rejects unknown topics.
    pub auto_create_partitions: Option<u32>,
}

impl Default for LogSettings {
    /// The settings the log suite uses: a 10 s lease, a short heartbeat so moving the
    /// [`entrega_core::ManualClock`] a little is enough to rebalance, and quick polling.
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            heartbeat: Duration::from_millis(100),
            poll_interval: Duration::from_millis(20),
            auto_create_partitions: None,
        }
    }
}

/// How a log transport's group membership behaves in time, for the scenarios whose pace
/// depends on it. The default describes the database-backed logs, whose members rebalance on
/// the harness clock at every poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogCapabilities {
    /// Longest wait of one scenario poll. Scenarios poll a bounded number of times, so this
    /// sets how much real time they give a rebalance: brokers whose joins, rebalances and
    /// member expiry take real seconds (Kafka) need a longer wait than clock-driven logs.
    pub poll_wait: Duration,
    /// Whether a lone member holds its partitions after its first poll. When false (a group
    /// join completing in the background, as with Kafka), scenarios keep polling until the
    /// assignment they need shows up.
    pub assigned_on_first_poll: bool,
    /// Whether members hold partitions by fenced leases kept under their names, so a member
    /// subscribing again under its name (a restarted process) takes its earlier life's
    /// partitions at once: the database-backed logs. Kafka's coordinator assigns partitions
    /// to sessions instead, and the scenario that checks this is skipped.
    pub leases_by_name: bool,
}

impl Default for LogCapabilities {
    fn default() -> Self {
        Self {
            poll_wait: Duration::from_millis(50),
            assigned_on_first_poll: true,
            leases_by_name: true,
        }
    }
}

impl LogCapabilities {
    /// Builder form: sets [`LogCapabilities::poll_wait`].
    pub fn with_poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait;
        self
    }

    /// Builder form: sets [`LogCapabilities::assigned_on_first_poll`].
    pub fn with_assigned_on_first_poll(mut self, yes: bool) -> Self {
        self.assigned_on_first_poll = yes;
        self
    }

    /// Builder form: sets [`LogCapabilities::leases_by_name`].
    pub fn with_leases_by_name(mut self, yes: bool) -> Self {
        self.leases_by_name = yes;
        self
    }
}

/// Creates fresh, isolated log transports.
#[async_trait]
pub trait LogHarness: Send + Sync {
    /// How the transport's groups behave in time; the default suits clock-driven logs.
    fn capabilities(&self) -> LogCapabilities {
        LogCapabilities::default()
    }

    /// A new log with no topics, configured with `settings`, reading time from `clock`.
    async fn log(
        &self,
        settings: LogSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Box<dyn LogFixture>, BoxError>;
}

/// One log transport under test.
#[async_trait]
pub trait LogFixture: Send + Sync {
    /// The log as a publisher.
    fn publisher(&self) -> Arc<dyn Publisher>;
    /// The log's topic administration.
    fn admin(&self) -> Arc<dyn TopicAdmin>;
    /// The log as a group subscriber.
    fn subscriber(&self) -> Arc<dyn Subscriber>;
    /// Committed next offsets of `group` on `topic`, per partition.
    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, BoxError>;
    /// End offsets (next offset to be written) of every partition of `topic`.
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, BoxError>;
    /// Reads records directly, without a group.
    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, BoxError>;
    /// Drops the database, when the backend can.
    async fn teardown(self: Box<Self>) -> Result<(), BoxError>;
    /// The transport's own account of a scenario that failed (its client's log lines about
    /// the scenario's topics, say), added to the failure. None by default.
    fn account(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Creates fresh, isolated dead-letter operator stores.
#[async_trait]
pub trait DlqHarness: Send + Sync {
    /// A new empty store with its migration applied.
    async fn dlq(&self) -> Result<Box<dyn DlqFixture>, BoxError>;
}

/// One dead-letter operator store under test.
#[async_trait]
pub trait DlqFixture: Send + Sync {
    /// The store.
    fn store(&self) -> Arc<dyn DlqStore>;
    /// Drops the database, when the backend can.
    async fn teardown(self: Box<Self>) -> Result<(), BoxError>;
}
