//! entrega's SQLite backend, the embedded default: what is SQLite's own. Connecting (WAL,
//! busy timeout, commit hooks), write transactions that queue instead of deadlocking
//! ([`begin_immediate`]), classifying its errors and in-process wake-ups after commits
//! ([`CommitWaiter`]).
//!
//! Several processes may share one database file: every write transaction starts with
//! `BEGIN IMMEDIATE`, so writers queue on the busy timeout instead of failing a lock upgrade.
//! Waiters in the same process are woken right after a commit; writes from other processes
//! are picked up by polling.
//!
//! entrega's stores (outbox, inbox, parking, dead-letter marks, the log transport) and their
//! migrations are written once for both databases over `entrega::Db`, which picks this backend or PostgreSQL from the URL.

mod connect;
mod errors;
mod wakeup;

pub use connect::{begin_immediate, connect};
pub use errors::classify;
pub use wakeup::{CommitWaiter, Watched};
