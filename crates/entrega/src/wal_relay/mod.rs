//! The WAL relay: publishes the outbox's inserts as PostgreSQL's logical replication stream
//! carries them, in commit order, without polling the table.
//!
//! A publication of the outbox's inserts and a `pgoutput` replication slot are read from one
//! session. Each inserted row becomes the record the polling relay would publish (the same
//! topic, key, headers and envelope, [`crate::Relay`]); rows are published in stream order,
//! so per-aggregate order holds, and a transaction that commits late is published when it
//! commits. Once the broker confirmed a batch, its rows get `publicado_en` in one statement,
//! and only after that statement committed is the position of the last whole transaction in
//! it confirmed to PostgreSQL. After a crash the stream resumes at the last confirmed
//! position: rows published but not yet confirmed go out again with the same `id_evento`,
//! which idempotent consumers absorb; nothing is skipped. The table stays the truth: a row
//! with `publicado_en` still `NULL` is one the broker may not have, and the polling relay
//! can always finish what the WAL relay did not.
//!
//! The slot is created once, with a snapshot: the rows committed before it and still pending
//! are published first, then the stream starts where the snapshot ends. A slot entrega created
//! that is missing or invalidated stops the relay with an error naming the recovery; it is
//! never created again silently, since the events in between would never be read. The server
//! lets one session stream from a slot, so a second relay waits and takes over when the first
//! one's session ends. A heartbeat written to the WAL while the outbox is idle keeps the slot's
//! position moving, so it never pins the WAL the rest of the database writes.

mod catch_up;
mod marker;
mod prepare;
mod publish;
mod session;
mod status;

use std::sync::Arc;
use std::time::Duration;

use entrega_core::{Publisher, StoreError};
use entrega_postgres::PgPool;
use tokio_util::sync::CancellationToken;

use crate::relay_config::{RelayConfig, RelayStats};
use crate::Db;

pub use status::SlotGauges;

/// Settings of the WAL relay beyond the [`RelayConfig`] both relays share.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WalConfig {
    /// The replication slot; `None` for `entrega_outbox_<database>`. Slot names are
    /// server-wide: two outboxes on one server need two names.
    pub slot: Option<String>,
    /// How often a heartbeat is written to the WAL, so an idle outbox's slot still releases
    /// WAL.
    pub heartbeat_interval: Duration,
    /// How soon a confirmed position is reported to PostgreSQL (at most this long after the
    /// mark committed).
    pub status_interval: Duration,
    /// How often the slot's state and WAL are read for the gauges (and a lost slot noticed).
    pub check_interval: Duration,
    /// Most rows one publish carries. While a publish waits for the broker, the stream is
    /// read into the next one up to this many rows: under a backlog every publish is this
    /// big, while a lone row still goes out at once. (`RelayConfig::batch_size` is the polling
    /// relay's per lane; the WAL has no lanes.)
    pub max_batch: usize,
    /// Shortest time between two marks of published rows: at a steady low rate one
    /// statement (and one commit) marks what several publishes confirmed. Positions are
    /// confirmed to PostgreSQL at most this much later; publishing does not wait.
    pub mark_every: Duration,
    /// Read the stream's values in binary form (PostgreSQL 14+): the server skips the text
    /// output of uuids, integers and timestamps, and the relay their parsing.
    pub binary: bool,
    /// Longest wait before a new session after one ended on a failure (the broker or the
    /// database away). Sessions end rather than hold the slot while nothing can be published,
    /// so this bounds how long after the broker's return the relay resumes.
    pub reconnect_max: Duration,
    /// Create the slot again when entrega's record says it existed: the deliberate recovery
    /// after an operator dropped it or PostgreSQL invalidated it. The rows still pending are
    /// published first, then the new slot's stream; rows published and marked meanwhile by
    /// the polling relay are not published again.
    pub recreate_slot: bool,
}

impl Default for WalConfig {
    /// The database's default slot, a heartbeat every 10 s, positions reported within 1 s,
    /// the slot read every 5 s, sessions started again within 5 s of a failure, publishes of at
    /// most 5,000 rows, marks at most every 100 ms, values in binary form.
    fn default() -> Self {
        Self {
            slot: None,
            heartbeat_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(1),
            check_interval: Duration::from_secs(5),
            reconnect_max: Duration::from_secs(5),
            max_batch: 5_000,
            mark_every: Duration::from_millis(100),
            binary: true,
            recreate_slot: false,
        }
    }
}

/// Why the WAL relay stopped. Transient failures (the database or the broker away, the stream
/// cut) are retried with backoff inside [`WalRelay::run`]; these need an operator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// The outbox is not on PostgreSQL.
    #[error("the WAL relay needs a PostgreSQL outbox; this database is {backend}")]
    NotPostgres {
        /// The backend found.
        backend: &'static str,
    },
    /// The server does not write logical WAL.
    #[error(
        "PostgreSQL runs with wal_level={found}; the WAL relay needs wal_level=logical \
         (set it in postgresql.conf and restart the server), or run the polling relay"
    )]
    WalLevel {
        /// The server's setting.
        found: String,
    },
    /// A slot entrega created is gone from the server.
    #[error(
        "replication slot {slot} was dropped: events committed since its last confirmed \
         position may never be read from it. Recovery: run the polling relay \
         (`km0 run relay --relay-source poll`), which publishes every row still pending, then \
         start the WAL relay with --recreate-slot"
    )]
    SlotDropped {
        /// The slot.
        slot: String,
    },
    /// PostgreSQL invalidated the slot (`wal_status = lost`): the WAL it needed was removed,
    /// typically past `max_slot_wal_keep_size`.
    #[error(
        "replication slot {slot} was invalidated by PostgreSQL (wal_status = lost, the WAL it \
         needed was removed past max_slot_wal_keep_size). Recovery: run the polling relay \
         (`km0 run relay --relay-source poll`), which publishes every row still pending, then \
         start the WAL relay with --recreate-slot"
    )]
    SlotLost {
        /// The slot.
        slot: String,
    },
    /// A slot of that name exists that entrega did not create, or that cannot be read.
    #[error("replication slot {slot} cannot be used: {why}")]
    ForeignSlot {
        /// The slot.
        slot: String,
        /// What is wrong with it.
        why: String,
    },
    /// The stream carried something the relay cannot read (a changed outbox table, a
    /// malformed message): stopping keeps the slot where it was, so nothing is skipped.
    #[error("the replication stream cannot be read: {0}")]
    Stream(String),
    /// The database refused for good (permissions, a missing table).
    #[error(transparent)]
    Store(StoreError),
}

/// Publishes the outbox from PostgreSQL's WAL. See the module docs.
pub struct WalRelay {
    url: String,
    /// The database the URL names (its slot must decode this one).
    database: String,
    slot: String,
    pool: PgPool,
    db: Db,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    wal: WalConfig,
    stats: Arc<RelayStats>,
    gauges: Arc<SlotGauges>,
}

impl std::fmt::Debug for WalRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalRelay")
            .field("config", &self.config)
            .field("wal", &self.wal)
            .finish_non_exhaustive()
    }
}

impl WalRelay {
    /// A WAL relay of the outbox in `db`, reached for replication at `url` (the URL `db` was
    /// opened with: its user needs the `REPLICATION` attribute), publishing through
    /// `publisher` as `config` says (topics, `origen`, batch size, backoff, retention).
    pub fn new(
        url: impl Into<String>,
        db: &Db,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
        wal: WalConfig,
    ) -> Result<Self, WalError> {
        let pool = db.postgres().cloned().ok_or(WalError::NotPostgres {
            backend: db.backend().name(),
        })?;
        let url = url.into();
        let first = entrega_postgres::first_server_url(&url).map_err(WalError::Store)?;
        let target = entrega_postgres::wal::replication_config(&first, "", "", wal.status_interval)
            .map_err(WalError::Store)?;
        let slot = wal
            .slot
            .clone()
            .unwrap_or_else(|| entrega_postgres::wal::slot::slot_name_for(&target.database));
        Ok(Self {
            url,
            database: target.database,
            slot,
            pool,
            db: db.clone(),
            publisher,
            config,
            wal,
            stats: Arc::default(),
            gauges: Arc::default(),
        })
    }

    /// The relay's counters (the same as the polling relay's: published rows and batches,
    /// failed publishes).
    pub fn stats(&self) -> Arc<RelayStats> {
        Arc::clone(&self.stats)
    }

    /// The slot's state as last read.
    pub fn gauges(&self) -> Arc<SlotGauges> {
        Arc::clone(&self.gauges)
    }

    /// The replication slot it reads.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// The relay's settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Runs until `shutdown` is cancelled or an operator is needed ([`WalError`]): prepares
    /// the publication and slot, publishes the rows the slot cannot carry (once, at its
    /// creation), then streams, reconnecting with backoff after transient failures. On
    /// shutdown the batch in flight is published and marked and its position confirmed.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), WalError> {
        let slot = self.slot.clone();
        let checks = shutdown.child_token();
        status::spawn_checks(self, &slot, checks.clone());
        let result = self.run_slot(&slot, &shutdown).await;
        checks.cancel();
        result
    }

    async fn run_slot(&self, slot: &str, shutdown: &CancellationToken) -> Result<(), WalError> {
        let mut failures = 0u32;
        let mut recreate = self.wal.recreate_slot;
        let mut waiting_logged = false;
        while !shutdown.is_cancelled() {
            let published = self.stats.published();
            let outcome = match prepare::plan(&self.pool, &self.database, slot, recreate).await {
                Ok(plan) => self.session(slot, plan, shutdown).await,
                Err(e) => Err(e),
            };
            let delay = match outcome {
                Ok(()) => return Ok(()),
                Err(session::End::Fatal(e)) => return Err(e),
                Err(session::End::Created) => {
                    recreate = false;
                    failures = 0;
                    continue;
                }
                Err(session::End::SlotBusy(pid)) => {
                    if !waiting_logged {
                        tracing::info!(
                            slot,
                            pid,
                            "replication slot is held by another relay; waiting to take over"
                        );
                        waiting_logged = true;
                    }
                    Duration::from_secs(1)
                }
                Err(session::End::Transient(why)) => {
                    // A session that got something through starts the backoff over.
                    if self.stats.published() > published {
                        failures = 0;
                    }
                    failures = failures.saturating_add(1);
                    let delay = self
                        .config
                        .backoff
                        .delay(failures)
                        .min(self.wal.reconnect_max);
                    tracing::warn!(slot, failures, ?delay, error = %why, "WAL relay session ended; reconnecting");
                    delay
                }
                Err(session::End::Streamed) => {
                    failures = 0;
                    waiting_logged = false;
                    Duration::from_millis(100)
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(delay) => {}
            }
        }
        Ok(())
    }
}
