//! pagos' database: one row per order's payment, the authorisations answered, and the
//! outbox its `pago.confirmado` / `pago.rechazado` leave through.
//!
//! A charge runs in three steps, so no transaction is held open across the gateway call:
//! [`PaymentStore::begin_charge`] records the intent (`iniciado`) and commits; the gateway is
//! called with the order's deterministic Idempotency-Key; [`PaymentStore::finish_charge`]
//! writes the result, the outbox event and the event's processed key in one transaction.
//! A process that dies in between finds its `iniciado` row on the redelivery and calls the
//! gateway again with the same key: the gateway answers with the charge it already made.

use entrega::db::{query, Db, Migration, Query, Tx};
use entrega::Event;
use entrega_core::{MigrationSet, StoreError};

use crate::contracts::payments;

use super::domain::{Authorisation, AuthorisationRequest, OrderToCharge};

/// The outbox aggregate of payments (`agregado`), routed to `pagos.eventos`.
pub const AGGREGATE: &str = "pago";
/// A charge that went through.
pub const PAYMENT_CONFIRMED: &str = "pago.confirmado";
/// A charge the gateway declined.
pub const PAYMENT_DECLINED: &str = "pago.rechazado";

const MIGRATIONS: &[Migration] = &[Migration::same(
    1,
    "pagos and autorizaciones",
    "CREATE TABLE IF NOT EXISTS pagos (
        pedido_id TEXT PRIMARY KEY, importe_centimos BIGINT NOT NULL, tarjeta TEXT NOT NULL,
        clave_idempotencia TEXT NOT NULL, estado TEXT NOT NULL, ref_pasarela TEXT,
        motivo TEXT, actualizado_ms BIGINT NOT NULL);
    CREATE TABLE IF NOT EXISTS autorizaciones (
        pedido_id TEXT PRIMARY KEY, importe_centimos BIGINT NOT NULL,
        autorizado INTEGER NOT NULL, id_autorizacion TEXT, motivo TEXT,
        creado_ms BIGINT NOT NULL);",
)];

/// Where a payment stands, stored in `pagos.estado`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentState {
    /// The intent is recorded; the gateway may or may not have charged (`iniciado`).
    Started,
    /// Charged (`confirmado`).
    Confirmed,
    /// Declined by the gateway (`rechazado`).
    Declined,
    /// Charged, then given back (`reembolsado`).
    Refunded,
    /// Cancelled before anything was charged: a charge asked for later is refused
    /// (`anulado`).
    Cancelled,
}

impl PaymentState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "iniciado",
            Self::Confirmed => "confirmado",
            Self::Declined => "rechazado",
            Self::Refunded => "reembolsado",
            Self::Cancelled => "anulado",
        }
    }

    pub(super) fn parse(name: &str) -> Option<Self> {
        [
            Self::Started,
            Self::Confirmed,
            Self::Declined,
            Self::Refunded,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// A payment as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The order.
    pub order_id: String,
    /// Amount in cents.
    pub amount_cents: i64,
    /// Its state.
    pub state: PaymentState,
    /// The gateway's charge id, once confirmed.
    pub gateway_ref: Option<String>,
    /// Why it was declined.
    pub reason: Option<String>,
}

/// A `pagos` row: order, amount, state, gateway reference, reason.
type PaymentRow = (String, i64, String, Option<String>, Option<String>);

/// What the gateway answered a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Charged, with the gateway's charge id.
    Approved(String),
    /// Declined, with the gateway's reason.
    Declined(String),
}

/// What [`PaymentStore::begin_charge`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeStart {
    /// Call the gateway (a fresh intent, or one left by an attempt that died).
    Call,
    /// The order's payment is settled already: nothing to charge.
    Settled,
}

/// pagos' database.
#[derive(Debug, Clone)]
pub struct PaymentStore {
    db: Db,
}

/// Who claims processed events in `mensajes_procesados`.
pub const CONSUMER: &str = "pagos.cobro";

impl PaymentStore {
    /// The store over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates entrega's tables (outbox, inbox and stored answers) and pagos' own.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db
            .migrate(&[
                MigrationSet::Outbox,
                MigrationSet::Inbox,
                MigrationSet::Rpc,
                MigrationSet::HeldLetters,
                MigrationSet::Dlq,
            ])
            .await?;
        self.db.apply_migrations("pagos", MIGRATIONS).await
    }

    /// Step 1: records the intent to charge `order` (once; a repeat finds it).
    pub async fn begin_charge(
        &self,
        order: &OrderToCharge,
        now_ms: i64,
    ) -> Result<ChargeStart, StoreError> {
        let mut tx = self.db.begin().await?;
        let start = begin_in(&mut tx, order, now_ms).await?;
        tx.commit().await?;
        Ok(start)
    }

    /// Step 3: the gateway's answer, the outbox event and `event_id`'s processed key, in one
    /// transaction. Returns `false` when the payment was settled already (a duplicate): the
    /// key is recorded, nothing else written.
    pub async fn finish_charge(
        &self,
        event_id: &str,
        order: &OrderToCharge,
        outcome: &ChargeOutcome,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.finish_charge_as(CONSUMER, event_id, order, outcome, now_ms)
            .await
    }

    /// [`PaymentStore::finish_charge`] with the key claimed for `consumer`.
    pub async fn finish_charge_as(
        &self,
        consumer: &str,
        event_id: &str,
        order: &OrderToCharge,
        outcome: &ChargeOutcome,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.db.begin().await?;
        tx.claim(consumer, event_id).await?;
        let updated = finish_in(&mut tx, order, outcome, now_ms).await?;
        failpoint_before_commit()?;
        tx.commit().await?;
        Ok(updated)
    }

    /// Records `event_id` as processed, and nothing else (its payment was settled under
    /// another delivery).
    pub async fn mark_processed(&self, event_id: &str) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await?;
        tx.claim(CONSUMER, event_id).await?;
        tx.commit().await
    }

    /// Events applied so far.
    pub async fn processed(&self) -> Result<u64, StoreError> {
        self.db.processed(CONSUMER).await
    }

    /// The order's payment.
    pub async fn payment(&self, order_id: &str) -> Result<Option<Payment>, StoreError> {
        let row: Option<PaymentRow> = self
            .db
            .fetch_optional(
                query(
                    "SELECT pedido_id, importe_centimos, estado, ref_pasarela, motivo \
                     FROM pagos WHERE pedido_id = $1",
                )
                .bind(order_id),
            )
            .await?;
        Ok(row.map(
            |(order_id, amount_cents, state, gateway_ref, reason)| Payment {
                order_id,
                amount_cents,
                state: PaymentState::parse(&state).unwrap_or(PaymentState::Started),
                gateway_ref,
                reason,
            },
        ))
    }
}

/// Records the authorisation answered to `request`, in the transaction that stores the answer.
pub async fn record_authorisation(
    tx: &mut Tx,
    request: &AuthorisationRequest,
    decision: &Authorisation,
    now_ms: i64,
) -> Result<(), StoreError> {
    record_authorisations(tx, &[(request, decision)], now_ms).await
}

/// Records many answered authorisations, a few statements for the lot
/// ([`authorisation_rows`]).
pub async fn record_authorisations(
    tx: &mut Tx,
    answered: &[(&AuthorisationRequest, &Authorisation)],
    now_ms: i64,
) -> Result<(), StoreError> {
    for q in authorisation_rows(answered, now_ms) {
        tx.execute(q).await?;
    }
    Ok(())
}

/// The statements recording answered authorisations: runs of [`entrega::db::row_runs`], six
/// parameters a row, well under SQLite's oldest limit of 999 per statement. An order
/// recorded already keeps its first row.
pub fn authorisation_rows(
    answered: &[(&AuthorisationRequest, &Authorisation)],
    now_ms: i64,
) -> Vec<Query> {
    entrega::db::row_runs(answered.len(), 128)
        .into_iter()
        .map(|run| {
            let chunk = &answered[run];
            let rows: Vec<String> = (0..chunk.len())
                .map(|i| {
                    let n = 6 * i;
                    format!(
                        "(${}, ${}, ${}, ${}, ${}, ${})",
                        n + 1,
                        n + 2,
                        n + 3,
                        n + 4,
                        n + 5,
                        n + 6
                    )
                })
                .collect();
            let sql = format!(
                "INSERT INTO autorizaciones (pedido_id, importe_centimos, autorizado, \
                 id_autorizacion, motivo, creado_ms) VALUES {} ON CONFLICT (pedido_id) DO NOTHING",
                rows.join(", ")
            );
            chunk.iter().fold(query(sql), |q, (request, decision)| {
                let (granted, id, reason) = match decision {
                    Authorisation::Granted(id) => (1, Some(id.clone()), None),
                    Authorisation::Refused(r) => (0, None, Some(r.clone())),
                };
                q.bind(request.order_id.clone())
                    .bind(request.amount_cents)
                    .bind(granted)
                    .bind(id)
                    .bind(reason)
                    .bind(now_ms)
            })
        })
        .collect()
}

/// Enqueues the answer to `order`'s charge: `pago.confirmado` or `pago.rechazado`, with the
/// charge's key (`clave`).
pub(super) async fn enqueue_result(
    tx: &mut Tx,
    order: &OrderToCharge,
    outcome: &ChargeOutcome,
) -> Result<(), StoreError> {
    let (order_id, amount_cents, key) = (
        order.order_id.clone(),
        order.amount_cents,
        order.charge_key(),
    );
    let event = match outcome {
        ChargeOutcome::Approved(gateway_ref) => payments::PaymentConfirmed {
            order_id,
            amount_cents,
            key,
            gateway_ref: gateway_ref.clone(),
        }
        .outgoing(AGGREGATE, &order.order_id)?,
        ChargeOutcome::Declined(reason) => payments::PaymentDeclined {
            order_id,
            amount_cents,
            key,
            reason: reason.clone(),
        }
        .outgoing(AGGREGATE, &order.order_id)?,
    };
    tx.enqueue(&event).await
}

/// Failpoint `pagos.before_commit`: after the gateway charged, before the result commits.
pub const BEFORE_COMMIT: &str = "pagos.before_commit";

pub(super) fn failpoint_before_commit() -> Result<(), StoreError> {
    entrega::failpoint::hit(BEFORE_COMMIT).map_err(StoreError::unavailable)
}

/// Step 1 in `tx`: the intent to charge `order`, once; whether to call the gateway.
pub(super) async fn begin_in(
    tx: &mut Tx,
    order: &OrderToCharge,
    now_ms: i64,
) -> Result<ChargeStart, StoreError> {
    tx.execute(
        query(
            "INSERT INTO pagos (pedido_id, importe_centimos, tarjeta, clave_idempotencia, \
                 estado, actualizado_ms) VALUES ($1, $2, $3, $4, 'iniciado', $5) \
                 ON CONFLICT (pedido_id) DO NOTHING",
        )
        .bind(order.order_id.clone())
        .bind(order.amount_cents)
        .bind(order.card.clone())
        .bind(order.charge_key())
        .bind(now_ms),
    )
    .await?;
    let state: Option<String> = tx
        .scalar(query("SELECT estado FROM pagos WHERE pedido_id = $1").bind(order.order_id.clone()))
        .await?;
    Ok(match state.as_deref().and_then(PaymentState::parse) {
        Some(PaymentState::Started) | None => ChargeStart::Call,
        Some(_) => ChargeStart::Settled,
    })
}

/// Step 3 in `tx`: the gateway's answer over the intent and its event in the outbox;
/// `false` when the payment was settled already (nothing written).
pub(super) async fn finish_in(
    tx: &mut Tx,
    order: &OrderToCharge,
    outcome: &ChargeOutcome,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let (state, gateway_ref, reason) = match outcome {
        ChargeOutcome::Approved(r) => (PaymentState::Confirmed, Some(r.clone()), None),
        ChargeOutcome::Declined(m) => (PaymentState::Declined, None, Some(m.clone())),
    };
    let updated = tx
        .execute(
            query(
                "UPDATE pagos SET estado = $1, ref_pasarela = $2, motivo = $3, \
                     actualizado_ms = $4 WHERE pedido_id = $5 AND estado = 'iniciado'",
            )
            .bind(state.as_str())
            .bind(gateway_ref.clone())
            .bind(reason.clone())
            .bind(now_ms)
            .bind(order.order_id.clone()),
        )
        .await?;
    if updated == 1 {
        enqueue_result(tx, order, outcome).await?;
    }
    Ok(updated == 1)
}
