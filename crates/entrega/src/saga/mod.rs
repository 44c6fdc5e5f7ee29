//! Sagas: a business transaction across services as a sequence of their local transactions,
//! each asked for by a command and answered by a reply, undone by compensations in reverse
//! order when a step fails for good, misses its deadline, or the saga is cancelled.
//!
//! The orchestrator's state lives in its own database (`entrega_sagas`, and every step's
//! history in `entrega_saga_history`) and changes only in the transaction that also
//! enqueues the commands it sends (the outbox) and claims the inbox key of the reply that
//! caused the change. A crash at any point leaves either the old state with the reply still
//! to be delivered, or the new state with its commands on their way: never one without the
//! other.
//!
//! - Keys are deterministic (`reserva-<pedido>`, `cobro-<pedido>`, `reembolso-<pedido>`):
//!   a command sent again, or delivered twice, is recognised by the service that applies it.
//! - A transient failure or a missing reply is sent again with backoff until the step's
//!   deadline; only a permanent failure or the deadline compensates. A step that timed out
//!   is compensated too: no reply does not mean no effect.
//! - A compensation is sent again until it succeeds; past its limit the saga waits for an
//!   operator ([`SagaStatus::NeedsOperator`], counted in [`SagaStats`]), who can
//!   [`Sagas::retry`] it.
//! - Replies that are late, repeated or under another key are recorded and ignored; a
//!   cancel while the saga runs compensates, a cancel after it completed is refused: one
//!   outcome, never both.
//! - Several orchestrators may share the tables: a saga row is locked while it changes
//!   (PostgreSQL), timers skip rows another one holds, and every write checks the version it
//!   read.

mod engine;
mod error;
mod flow;
mod machine;
mod record;
mod runner;
mod stats;
mod store;

#[cfg(test)]
mod machine_tests;

pub use engine::{CancelOutcome, ReplyOutcome, Sagas, Started};
pub use error::SagaError;
pub use flow::{Ending, FlowError, Reply, SagaFlow, StepOutcome, StepSpec};
pub use record::{EventKind, HistoryEntry, Phase, SagaRecord, SagaStatus};
pub use stats::{SagaStats, SagaStatsSnapshot};
