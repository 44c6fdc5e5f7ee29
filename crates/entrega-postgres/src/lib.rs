//! entrega on PostgreSQL: the transactional outbox with relay lane leases, the idempotent
//! inbox, a database-backed log transport, and the migrations that create their tables.
//!
//! ```no_run
//! use entrega_core::{MigrationSet, NewEvent};
//! use entrega_postgres::PgOutbox;
//!
//! # async fn order() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = entrega_postgres::connect("postgres://postgres@127.0.0.1:5432/km0_pedidos").await?;
//! entrega_postgres::migrate(&pool, &[MigrationSet::Outbox]).await?;
//! let mut tx = pool.begin().await?;
//! // ... the business write on `&mut *tx`, then in the same transaction:
//! let datos = serde_json::json!({ "id": "P-1" });
//! PgOutbox::enqueue(&mut tx, &NewEvent::new("pedido", "P-1", "pedido.creado", datos)).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Applications usually go through `entrega::Db`, which picks this backend or SQLite from the
//! URL.

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
mod roles;
mod wakeup;

pub use connect::{connect, ensure_database, SESSION_LIMITS};
pub use dlq::PgDlqStore;
pub use errors::classify;
pub use inbox::PgInbox;
pub use log::{LogConfig, PgLog, PgSubscription};
pub use migrations::{apply_migrations, latest_version, migrate};
pub use outbox::PgOutbox;
pub use parking::PgParking;
pub use roles::{grant_service_role, APPEND_ONLY, READ_ONLY};

/// The driver types callers need to hold pools and pass transactions.
pub use sqlx::postgres::{PgConnection, PgPool};
