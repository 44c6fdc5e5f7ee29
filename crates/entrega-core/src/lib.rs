//! Vocabulary and seams of entrega: the event envelope, headers, delivery outcomes, classified
//! errors, and the small traits that transports and stores implement. No I/O lives here.

mod clock;
mod envelope;
mod lease;
mod error;
pub mod headers;
mod outbox;
mod outcome;
mod partition;
mod transport;

pub use clock::{Clock, ManualClock, SystemClock};
pub use envelope::{now_ms, Envelope, EnvelopeError, Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH};
pub use error::{StoreError, TransportError};
pub use headers::Headers;
pub use lease::{fair_share, plan_balance, BalancePlan, SlotLease};
pub use outbox::{
    lane_of, LaneLease, LaneLeases, NewEvent, OutboxMaintenance, OutboxReader, OutboxRow,
    OutboxStatus, OutboxWakeup, LANES,
};
pub use outcome::{ErrorClass, HandlerError, Outcome};
pub use partition::{murmur2, partition_for};
pub use transport::{OutgoingMessage, Publisher, Record, Subscriber, Subscription, TopicAdmin};

/// Result of running an effect through an idempotent consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed<T> {
    /// The key was new: the effect ran and was committed with the key.
    Applied(T),
    /// The key was already recorded: nothing ran.
    Duplicate,
}
