//! Conformance suites every entrega store and transport must pass, plus the fakes and fault
//! injectors the engine's tests are built on.
//!
//! A backend implements the small harness traits ([`OutboxHarness`], [`InboxHarness`],
//! [`LogHarness`]) in its `tests/conformance.rs`, wrapping the backend-typed functions that
//! take a transaction, and expands the suites:
//!
//! ```ignore
//! entrega_testkit::outbox_conformance!(MyHarness::new());
//! entrega_testkit::inbox_conformance!(MyHarness::new());
//! entrega_testkit::log_conformance!(MyHarness::new());
//! entrega_testkit::parking_conformance!(MyHarness::new());
//! entrega_testkit::dlq_conformance!(MyHarness::new());
//! ```
//!
//! Scenarios return [`Scenario`] (`Result<(), BoxError>`) rather than panicking, so the
//! fixture's database is dropped even when a check fails.

mod fault;
mod harness;
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
pub use runner::{run_all_dlq, run_all_inbox, run_all_log, run_all_outbox, run_all_parking};
pub use suite::{dlq, inbox, log, outbox, parking};
pub use wait::{wait_until, CheckFailed, CHECK_EVERY};
