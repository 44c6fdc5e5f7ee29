//! Conformance suites every entrega store and transport must pass, plus the fakes and fault
//! injectors the engine's tests are built on.
//!
//! A backend implements the small harness traits ([`OutboxHarness`], [`InboxHarness`],
//! [`LogHarness`], ...) in its `tests/conformance.rs`, wrapping the backend-typed functions
//! that take a transaction, and expands the suites, one test per scenario
//! (`entrega_testkit::outbox_conformance!(MyHarness::new());`, and `inbox_`, `log_`,
//! `parking_`, `dlq_`, `delivery_conformance!`), or runs a whole suite at once. The in-memory fakes pass
//! every suite:
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> entrega_testkit::Scenario {
//! let harness = entrega_testkit::memory::MemoryHarness;
//! entrega_testkit::run_all_inbox(&harness).await?;
//! entrega_testkit::run_all_parking(&harness).await?;
//! # Ok(()) }
//! ```
//!
//! Scenarios return [`Scenario`] (`Result<(), BoxError>`) rather than panicking, so the
//! fixture's database is dropped even when a check fails.

mod fault;
mod harness;
mod harness_delivery;
pub mod memory;
mod runner;
mod suite;
mod wait;

pub use fault::{Fault, FlakyPublisher, InjectedFault};
pub use harness::{
    BoxError, DlqFixture, DlqHarness, HeldTx, InboxFixture, InboxHarness, LogCapabilities,
    LogFixture, LogHarness, LogSettings, OutboxFixture, OutboxHarness, ParkingFixture,
    ParkingHarness, RowState, Scenario, TxEnd,
};
pub use harness_delivery::{DeliveryFixture, DeliveryHarness};
pub use runner::{
    run_all_delivery, run_all_dlq, run_all_inbox, run_all_log, run_all_outbox, run_all_parking,
};
pub use suite::{delivery, dlq, inbox, log, outbox, parking};
pub use wait::{wait_until, CheckFailed, CHECK_EVERY};
