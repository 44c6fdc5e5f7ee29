//! One open transaction on whichever backend its [`Db`](super::Db) holds.

use std::sync::Arc;

use entrega_contracts::{Catalog, Event};
use entrega_core::{NewEvent, StoreError};
use sqlx::{PgConnection, PgPool, Postgres, Sqlite, SqliteConnection, Transaction};

use super::exec;
use super::rows::{Column, FromRow};
use super::{query, query_each, Backend, Query, TextList};

/// An open write transaction: the business change, the outbox [`enqueue`](Tx::enqueue) and
/// the inbox [`claim`](Tx::claim) all go through it, and commit together or not at all.
/// Dropping it without [`commit`](Tx::commit) rolls everything back.
///
/// On SQLite it starts with `BEGIN IMMEDIATE`, so concurrent writers queue on the busy
/// timeout instead of failing a lock upgrade.
#[derive(Debug)]
pub struct Tx {
    inner: Inner,
    contracts: Option<Arc<Catalog>>,
    /// On PostgreSQL, the pool to notify the relays through once this transaction commits,
    /// when it wrote to the outbox.
    notify: Option<PgPool>,
    notify_pending: bool,
}

#[derive(Debug)]
enum Inner {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

impl Tx {
    pub(super) fn sqlite_tx(tx: Transaction<'static, Sqlite>) -> Self {
        Self {
            inner: Inner::Sqlite(tx),
            contracts: None,
            notify: None,
            notify_pending: false,
        }
    }

    pub(super) fn postgres_tx(tx: Transaction<'static, Postgres>, pool: PgPool) -> Self {
        Self {
            inner: Inner::Postgres(tx),
            contracts: None,
            notify: Some(pool),
            notify_pending: false,
        }
    }

    pub(super) fn with_contracts(mut self, contracts: Option<Arc<Catalog>>) -> Self {
        self.contracts = contracts;
        self
    }

    /// The backend this transaction runs on.
    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs a statement; returns how many rows it affected.
    pub async fn execute(&mut self, q: Query) -> Result<u64, StoreError> {
        match &mut self.inner {
            Inner::Sqlite(tx) => exec::sqlite::execute(&mut **tx, q).await,
            Inner::Postgres(tx) => exec::postgres::execute(&mut **tx, q).await,
        }
    }

    /// The first row of a query, if any.
    pub async fn fetch_optional<T: FromRow>(&mut self, q: Query) -> Result<Option<T>, StoreError> {
        match &mut self.inner {
            Inner::Sqlite(tx) => exec::sqlite::fetch_optional(&mut **tx, q).await,
            Inner::Postgres(tx) => exec::postgres::fetch_optional(&mut **tx, q).await,
        }
    }

    /// Every row of a query.
    pub async fn fetch_all<T: FromRow>(&mut self, q: Query) -> Result<Vec<T>, StoreError> {
        match &mut self.inner {
            Inner::Sqlite(tx) => exec::sqlite::fetch_all(&mut **tx, q).await,
            Inner::Postgres(tx) => exec::postgres::fetch_all(&mut **tx, q).await,
        }
    }

    /// The first column of the first row, if any.
    pub async fn scalar<T: Column>(&mut self, q: Query) -> Result<Option<T>, StoreError> {
        let row: Option<(T,)> = self.fetch_optional(q).await?;
        Ok(row.map(|(value,)| value))
    }

    /// Writes `event` to the outbox in this transaction: it exists if and only if the
    /// business change commits, and the relay publishes it afterwards. Inside
    /// [`crate::trace::scope`] the event carries the current trace context as `traceparent`
    /// (unless it has one of its own).
    pub async fn enqueue(&mut self, event: &NewEvent) -> Result<(), StoreError> {
        self.enqueue_all(std::slice::from_ref(event)).await
    }

    /// Writes every event, in order, to the outbox in this transaction, each with the trace
    /// context as [`Tx::enqueue`] does.
    ///
    /// With contracts ([`Db::with_contracts`](super::Db::with_contracts)), every event is
    /// checked first; one that breaks its contract fails the call with
    /// [`StoreError::Contract`] and none of `events` is written.
    pub async fn enqueue_all(&mut self, events: &[NewEvent]) -> Result<(), StoreError> {
        if let Some(catalog) = &self.contracts {
            for event in events {
                catalog.validate(&event.kind, event.version, &event.payload)?;
            }
        }
        let events = crate::trace::stamped(events);
        crate::store::outbox::enqueue_all(self, &events).await?;
        self.notify_relays();
        Ok(())
    }

    /// Has the relays look at the outbox once this transaction commits. [`Tx::enqueue`] and
    /// [`Tx::enqueue_all`] do it; call it after writing outbox rows some other way (a
    /// statement of your own), or the relays find them only on their next poll.
    ///
    /// On PostgreSQL entrega's sessions notify in a statement of their own after the commit,
    /// not in the transaction (whose `NOTIFY` would hold the server's one notification lock
    /// until the commit is on disk, making every such commit wait for the others). On SQLite
    /// the relays poll, and this does nothing.
    pub fn notify_relays(&mut self) {
        self.notify_pending = self.notify.is_some();
    }

    /// Writes `event` of `aggregate` `aggregate_id` to the outbox, as [`Tx::enqueue`] does,
    /// with its `tipo` and `version` from its type.
    ///
    /// ```no_run
    /// use entrega::{Db, Event};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
    /// struct PedidoCancelado {
    ///     pedido_id: String,
    ///     motivo: String,
    /// }
    ///
    /// impl Event for PedidoCancelado {
    ///     const TIPO: &'static str = "pedido.cancelado";
    ///     const VERSION: u32 = 1;
    /// }
    ///
    /// # async fn cancel(db: Db) -> Result<(), entrega::StoreError> {
    /// let mut tx = db.begin().await?;
    /// // ... the business change in `tx` ...
    /// let event = PedidoCancelado { pedido_id: "P-1".into(), motivo: "sin stock".into() };
    /// tx.publish("pedido", "P-1", &event).await?;
    /// tx.commit().await?; // the change and its event, or neither
    /// # Ok(()) }
    /// ```
    pub async fn publish<E: Event>(
        &mut self,
        aggregate: &str,
        aggregate_id: &str,
        event: &E,
    ) -> Result<(), StoreError> {
        self.enqueue(&event.outgoing(aggregate, aggregate_id)?)
            .await
    }

    /// The answer stored for request `key` of `consumer` by an earlier transaction
    /// ([`Tx::store_answer`]), if there is one: a repeated request gets it back unchanged.
    pub async fn stored_answer(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.stored_answers(consumer, &[key]).await?.remove(key))
    }

    /// The stored answers to the requests `keys` of `consumer`, by key (those with none are
    /// missing): one query for a batch instead of one per request.
    pub async fn stored_answers(
        &mut self,
        consumer: &str,
        keys: &[&str],
    ) -> Result<std::collections::HashMap<String, Vec<u8>>, StoreError> {
        if keys.is_empty() {
            return Ok(std::collections::HashMap::new());
        }
        let rows: Vec<(String, Vec<u8>)> = self
            .fetch_all(
                query_each(
                    "SELECT request_key, answer FROM entrega_answers WHERE consumer = $1 \
                     AND request_key IN (SELECT value FROM json_each($2))",
                    "SELECT request_key, answer FROM entrega_answers WHERE consumer = $1 \
                     AND request_key = ANY($2::text[])",
                )
                .bind(consumer)
                .bind(TextList::of(keys)),
            )
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// Stores `answer` to request `key` of `consumer`, in this transaction, next to the
    /// effect that produced it. Returns `false` when an answer was already stored (another
    /// handling of the same request committed first): roll back and answer with
    /// [`Tx::stored_answer`] instead.
    pub async fn store_answer(
        &mut self,
        consumer: &str,
        key: &str,
        answer: &[u8],
    ) -> Result<bool, StoreError> {
        Ok(self.store_answers(consumer, &[(key, answer)]).await? == 1)
    }

    /// Stores the answers of several requests of `consumer` at once (a few statements for
    /// a batch instead of one per request). Returns how many were written: fewer than
    /// given means some were stored already (another handling committed first).
    pub async fn store_answers(
        &mut self,
        consumer: &str,
        answers: &[(&str, &[u8])],
    ) -> Result<u64, StoreError> {
        let mut written = 0;
        for q in super::answers::insert_answers(consumer, answers, super::answers::Repeat::Skip) {
            written += self.execute(q).await?;
        }
        Ok(written)
    }

    /// Records a request to send to `queue` and wait a reply for (durable request/reply,
    /// [`crate::rpc::DurableRequester`]), named `correlation_id` (deterministic: a retry of
    /// the same logical request is recognised), due by `deadline_ms`. Returns `false` when
    /// that request is recorded already.
    pub async fn request(
        &mut self,
        queue: &str,
        correlation_id: &str,
        payload: &[u8],
        deadline_ms: i64,
    ) -> Result<bool, StoreError> {
        let written = self
            .execute(
                query(
                    "INSERT INTO entrega_requests (correlation_id, queue, payload, state, \
                     deadline_ms, created_at_ms) VALUES ($1, $2, $3, 'pending', $4, $5) \
                     ON CONFLICT (correlation_id) DO NOTHING",
                )
                .bind(correlation_id)
                .bind(queue)
                .bind(payload.to_vec())
                .bind(deadline_ms)
                .bind(entrega_core::now_ms()),
            )
            .await?;
        Ok(written == 1)
    }

    /// Runs `text` as one script: several statements, no parameters (a schema step).
    pub(super) async fn script(&mut self, text: &str) -> Result<(), StoreError> {
        use sqlx::Executor as _;
        // A plain `&str` runs every statement of the script (PostgreSQL's simple-query
        // protocol) and keeps the future `Send`, unlike `raw_sql`.
        match &mut self.inner {
            Inner::Sqlite(tx) => (&mut **tx)
                .execute(text)
                .await
                .map(drop)
                .map_err(entrega_sqlite::classify),
            Inner::Postgres(tx) => (&mut **tx)
                .execute(text)
                .await
                .map(drop)
                .map_err(entrega_postgres::classify),
        }
    }

    /// Commits everything written in this transaction.
    ///
    /// On PostgreSQL, a transaction that wrote to the outbox then notifies the relays
    /// ([`Tx::notify_relays`]); if that fails the commit still stands, and the relays find
    /// the rows on their next poll.
    pub async fn commit(self) -> Result<(), StoreError> {
        match self.inner {
            Inner::Sqlite(tx) => tx.commit().await.map_err(entrega_sqlite::classify),
            Inner::Postgres(tx) => {
                tx.commit().await.map_err(entrega_postgres::classify)?;
                if let (true, Some(pool)) = (self.notify_pending, &self.notify) {
                    notify_outbox(pool).await;
                }
                Ok(())
            }
        }
    }

    /// Undoes everything written in this transaction (as dropping it does, but waiting for
    /// the database to confirm).
    pub async fn rollback(self) -> Result<(), StoreError> {
        match self.inner {
            Inner::Sqlite(tx) => tx.rollback().await.map_err(entrega_sqlite::classify),
            Inner::Postgres(tx) => tx.rollback().await.map_err(entrega_postgres::classify),
        }
    }

    /// The PostgreSQL connection of this transaction, for a path written for PostgreSQL
    /// alone (arrays, `UNNEST`, one-statement batches); `None` on SQLite.
    pub fn postgres(&mut self) -> Option<&mut PgConnection> {
        match &mut self.inner {
            Inner::Postgres(tx) => Some(&mut **tx),
            Inner::Sqlite(_) => None,
        }
    }

    /// The SQLite connection of this transaction, for a path written for SQLite alone;
    /// `None` on PostgreSQL.
    pub fn sqlite(&mut self) -> Option<&mut SqliteConnection> {
        match &mut self.inner {
            Inner::Sqlite(tx) => Some(&mut **tx),
            Inner::Postgres(_) => None,
        }
    }
}

/// Wakes the relays listening on the outbox's channel, in a statement of its own.
async fn notify_outbox(pool: &PgPool) {
    let notify = sqlx::query("SELECT pg_notify($1, '')")
        .bind(entrega_postgres::OUTBOX_CHANNEL)
        .execute(pool)
        .await;
    if let Err(e) = notify {
        tracing::debug!(error = %e, "notifying the relays after a commit failed: they will poll");
    }
}
