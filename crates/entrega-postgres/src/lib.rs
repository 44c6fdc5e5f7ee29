//! entrega's PostgreSQL backend: what is PostgreSQL's own. Connecting (TLS, session limits,
//! creating databases), classifying its errors as transient or not, `LISTEN`/`NOTIFY`
//! wake-ups and least-privilege roles.
//!
//! entrega's stores (outbox, inbox, parking, dead-letter marks, the log transport) and their
//! migrations are written once for both databases over `entrega::Db`, which picks this backend or SQLite from the URL:
//!
//! ```no_run
//! # async fn order() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = entrega_postgres::connect("postgres://postgres@127.0.0.1:5432/km0_pedidos").await?;
//! let mut tx = pool.begin().await.map_err(entrega_postgres::classify)?;
//! // ... a write only PostgreSQL can make, on `&mut *tx` ...
//! tx.commit().await.map_err(entrega_postgres::classify)?;
//! # Ok(()) }
//! ```

mod connect;
mod errors;
mod failover;
mod hosts;
mod roles;
mod wakeup;
pub mod wal;

pub use connect::{connect, ensure_database, NOTIFY_AFTER_COMMIT, SESSION_LIMITS};
pub use errors::classify;
pub use hosts::{current_server_url, first_server_url, SessionAttrs};
pub use roles::{grant_service_role, APPEND_ONLY, READ_ONLY};
pub use wakeup::{Listener, OUTBOX_CHANNEL};

/// The driver types callers need to hold pools and pass transactions.
pub use sqlx::postgres::{PgConnection, PgPool};
