//! What one delivery of a record comes to: the worker's decisions, and the failure a retry
//! carries.

use std::time::Duration;

use entrega_core::DeadReason;

/// A transient failure with attempts left: when to try again, and what went wrong.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub(super) after: Duration,
    pub(super) error: String,
}

/// What became of one record in this delivery, before it is applied to offsets and
/// positions. Every delivery ends in exactly one decision:
///
/// - final for its offset, which may then be committed: [`Ack`](Self::Ack),
///   [`Ignore`](Self::Ignore), [`Dead`](Self::Dead) (written to the dead-letter topic),
///   [`Skip`](Self::Skip), [`Deferred`](Self::Deferred) (written to the retry topic),
///   [`Parked`](Self::Parked) (written to the parking store);
/// - the record comes again from this offset, in order: [`Retry`](Self::Retry) in place,
///   [`Wait`](Self::Wait), [`NotAttempted`](Self::NotAttempted);
/// - on its way to a side store, where a failure to write turns it into a retry in place:
///   [`Dead`](Self::Dead), [`Retry`](Self::Retry) under the retry-topic and ordered
///   strategies, [`Park`](Self::Park).
pub(super) enum Decision {
    /// The handler committed the effect (or found it already applied).
    Ack,
    /// No handler takes this type, and the router says to let it pass.
    Ignore,
    /// Set aside for an operator, with the reason.
    Dead(DeadReason),
    /// A dead letter the broker refused, held in the consumer's database: final for this
    /// offset.
    Held(DeadReason),
    /// Already final before this delivery: nothing to do, nothing to count again.
    Skip,
    /// Try again; the retry strategy says where (in place, the retry topic, parking).
    Retry(Failure),
    /// Deliver again once this delay has passed, without counting an attempt.
    Wait(Duration),
    /// Not run: an earlier record of its partition (or key) comes again first.
    NotAttempted,
    /// To be parked with its key: `Some` for the failed head, `None` for a record behind it.
    Park(Option<Failure>),
    /// Sent to the retry topic: final for this offset.
    Deferred,
    /// Stored in the parking store (the failed head, or a record behind it): final for this
    /// offset.
    Parked { head: bool },
}

impl Decision {
    /// Whether later records of the same partition (or key) must wait: they come again in
    /// order.
    pub(super) fn blocks(&self) -> bool {
        matches!(self, Self::Retry(_) | Self::Wait(_) | Self::NotAttempted)
    }

    /// The decision for a failure with attempts left.
    pub(super) fn retry(after: Duration, error: impl std::fmt::Display) -> Self {
        Self::Retry(Failure {
            after,
            error: error.to_string(),
        })
    }
}
