//! entrega on SQLite, the embedded default backend: the transactional outbox with relay lanes
//! ([`SqliteOutbox`]), the idempotent consumer's key table ([`SqliteInbox`]), a database-backed
//! log transport ([`SqliteLog`]) and entrega's migrations.
//!
//! Several processes may share one database file: it runs in WAL mode with a busy timeout,
//! and every write transaction of this crate starts with `BEGIN IMMEDIATE` (see
//! [`begin_immediate`]) so writers queue instead of deadlocking on lock upgrades. Relays and
//! log subscribers in the same process are woken right after a commit; writes from other
//! processes are picked up by polling.
//!
//! ```ignore
//! let pool = entrega_sqlite::connect("sqlite://data/pedidos.db").await?;
//! entrega_sqlite::migrate(&pool, &[MigrationSet::Outbox]).await?;
//! let mut tx = entrega_sqlite::begin_immediate(&pool).await?;
//! // ... the business change ...
//! SqliteOutbox::enqueue(&mut *tx, &event).await?;
//! tx.commit().await?;
//! ```

mod connect;
mod dlq;
mod errors;
mod inbox;
mod lanes;
mod log;
mod migrations;
mod outbox;
mod outbox_blocked;
mod outbox_lanes;
mod parking;
mod signal;
mod timefmt;

pub use connect::{begin_immediate, connect};
pub use dlq::SqliteDlqStore;
pub use errors::classify;
pub use inbox::SqliteInbox;
pub use log::{LogConfig, SqliteLog};
pub use migrations::migrate;
pub use outbox::SqliteOutbox;
pub use parking::SqliteParking;
