//! In-memory implementations of the seams, following the same rules as the database backends.
//!
//! They run the engine's tests without a database, and the testkit checks them against its
//! own conformance suites, which keeps the suites honest too.

mod dlq;
mod harness;
mod inbox;
mod log;
mod log_subscription;
mod outbox;
mod outbox_maintenance;
mod parking;

pub use dlq::MemoryDlqStore;
pub use harness::MemoryHarness;
pub use inbox::MemoryInbox;
pub use log::MemoryLog;
pub use outbox::{MemoryOutbox, MemoryTx};
pub use parking::MemoryParking;
