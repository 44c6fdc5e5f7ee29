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
//! ```no_run
//! use entrega_core::{MigrationSet, NewEvent};
//! use entrega_sqlite::SqliteOutbox;
//!
//! # async fn order() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = entrega_sqlite::connect("sqlite://data/pedidos.db").await?;
//! entrega_sqlite::migrate(&pool, &[MigrationSet::Outbox]).await?;
//! let mut tx = entrega_sqlite::begin_immediate(&pool).await?;
//! // ... the business change, on `&mut *tx` ...
//! let event = NewEvent::new("pedido", "P-1", "pedido.creado", serde_json::json!({ "id": "P-1" }));
//! SqliteOutbox::enqueue(&mut tx, &event).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Applications usually go through `entrega::Db`, which picks this backend or PostgreSQL
//! from the URL.

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
mod timefmt;
mod wakeup;

pub use connect::{begin_immediate, connect};
pub use dlq::SqliteDlqStore;
pub use errors::classify;
pub use inbox::SqliteInbox;
pub use log::{LogConfig, SqliteLog};
pub use migrations::{apply_migrations, latest_version, migrate};
pub use outbox::SqliteOutbox;
pub use parking::SqliteParking;
