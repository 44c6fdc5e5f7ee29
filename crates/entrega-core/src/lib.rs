//! Vocabulary and seams of entrega: the event envelope, headers, classified handler failures
//! and store errors, and the small traits that transports and stores implement. No I/O lives here.

mod clock;
mod contract_error;
mod dead_reason;
mod dlq;
mod duplicate_keys;
mod envelope;
mod error;
pub mod failpoint;
mod handler_error;
pub mod headers;
mod held;
mod inspect;
mod lease;
pub mod migration;
mod namespace;
mod outbox;
mod outbox_blocked;
mod parking;
mod partition;
mod raw_json;
mod redact;
mod replay_key;
mod rpc;
mod side_queues;
pub mod trace;
mod transport;
pub mod utc;

pub use clock::{Clock, ManualClock, SystemClock};
pub use contract_error::ContractError;
pub use dead_reason::{DeadClass, DeadReason};
pub use dlq::{
    DeadLetterId, DeadLetterMark, DeadLetterState, DlqAction, DlqAuditEntry, DlqStore,
    InvalidDeadLetterId,
};
pub use duplicate_keys::first_duplicate_key;
pub use envelope::{now_ms, Envelope, EnvelopeError, Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH};
pub use error::{StoreError, TransportError};
pub use handler_error::{ErrorClass, HandlerError};
pub use headers::Headers;
pub use held::{HeldId, HeldLetter, HeldLetterStore, HeldRow};
pub use inspect::{group_lag, LogInspector, PartitionLag};
pub use lease::{fair_share, plan_balance, BalancePlan, Holder, SlotLease};
pub use namespace::{InvalidNamespace, Namespace, MAX_NAMESPACE_LEN};
pub use outbox::{
    lane_of, LaneCursor, LaneLease, LaneLeases, LaneMark, LaneRows, NewEvent, OutboxMaintenance,
    OutboxReader, OutboxRow, OutboxStatus, OutboxWakeup, LANES,
};
pub use outbox_blocked::{
    truncate_error, BlockedRow, Refusal, ReleaseError, BLOCKED_ROWS_LISTED, MAX_ERROR_CHARS,
};
pub use parking::{ParkedAt, ParkedRecord, ParkingStore};
pub use partition::{murmur2, partition_for};
pub use raw_json::RawJson;
pub use redact::{is_secret_name, redact_settings, redact_url, REDACTED};
pub use replay_key::{ReplayKey, ShortReplayKey, MIN_REPLAY_KEY_BYTES};
pub use rpc::{RpcDelivery, RpcInbox, RpcMessage, RpcTransport};
pub use side_queues::SideQueues;
pub use trace::{TraceContext, TraceparentError, TRACEPARENT};
pub use transport::{OutgoingMessage, Publisher, Record, Subscriber, Subscription, TopicAdmin};

/// Result of running an effect through an idempotent consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed<T> {
    /// The key was new: the effect ran and was committed with the key.
    Applied(T),
    /// The key was already recorded: nothing ran.
    Duplicate,
}

/// Independent groups of entrega's own tables; a database gets only the sets it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigrationSet {
    /// `outbox` and the relay's lane leases: for services that publish events.
    Outbox,
    /// `mensajes_procesados` and `entrega_parked` (parking for ordered retries): for
    /// services that consume.
    Inbox,
    /// Request/reply: `entrega_answers` (the stored answers of idempotent request
    /// handlers) and `entrega_requests` (a durable requester's requests awaiting replies).
    Rpc,
    /// `entrega_held_letters`: dead letters the broker refused, held in the consumer's database
    /// for an operator. For services whose consumers send dead letters.
    HeldLetters,
    /// The database-backed log transport's topics, partitions, offsets and leases.
    Log,
    /// The sagas' rows and their history (`entrega_sagas`, `entrega_saga_history`): for
    /// the service that orchestrates sagas.
    Sagas,
    /// Operator state of dead letters (`entrega_dlq_state`) and the audit of operator
    /// actions (`entrega_dlq_audit`): for the service whose dead-letter topic is tended.
    Dlq,
}

impl MigrationSet {
    /// Every set.
    pub const ALL: [MigrationSet; 7] = [
        Self::Outbox,
        Self::Inbox,
        Self::Rpc,
        Self::HeldLetters,
        Self::Log,
        Self::Sagas,
        Self::Dlq,
    ];

    /// The name recorded in `entrega_migrations.set_name`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Outbox => "outbox",
            Self::Inbox => "inbox",
            Self::Rpc => "rpc",
            Self::HeldLetters => "held_letters",
            Self::Log => "log",
            // The name applications recorded before the sagas' tables were one of
            // entrega's sets.
            Self::Sagas => "entrega_saga",
            Self::Dlq => "dlq",
        }
    }
}
