//! Refunds, the order saga's compensation of a charge, in three steps as the charge is: what
//! pagos knows decides first (nothing recorded: nothing was charged, and the order is marked
//! `anulado` so a charge asked for later is refused; refunded, declined or cancelled
//! already: the same answer again); otherwise the gateway is asked with the refund's own
//! Idempotency-Key (`reembolso-<pedido>`), with no transaction open, and its answer is
//! written with `pago.reembolsado` in one transaction.

use entrega::db::query;
use entrega::{ContractError, Event};
use entrega_core::{NewEvent, StoreError};

use crate::contracts::payments;

use super::db::{failpoint_before_commit, PaymentState, PaymentStore, AGGREGATE};

/// A charge given back, or nothing to give back (`pago.reembolsado`).
pub const PAYMENT_REFUNDED: &str = "pago.reembolsado";

/// What the gateway answered a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundOutcome {
    /// The charge was given back: this many cents.
    Refunded(i64),
    /// Nothing had been charged.
    NothingCharged,
}

/// `pagos.reembolsar`: `{"pedido_id", "clave"}` (the refund's key, `reembolso-<pedido>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    /// The order.
    pub order_id: String,
    /// The refund's Idempotency-Key.
    pub key: String,
}

impl RefundRequest {
    /// The key of the charge it gives back (`cobro-<pedido>`).
    pub fn charge_key(&self) -> String {
        format!("cobro-{}", self.order_id)
    }
}

/// What [`PaymentStore::begin_refund`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundStart {
    /// Answered from what pagos knows (the answer and the key are committed).
    Answered,
    /// The gateway must be asked: a charge was, or may have been, made.
    Call,
}

fn refunded_event(request: &RefundRequest, cents: i64) -> Result<NewEvent, ContractError> {
    payments::PaymentRefunded {
        order_id: request.order_id.clone(),
        key: request.key.clone(),
        amount_cents: cents,
    }
    .outgoing(AGGREGATE, &request.order_id)
}

impl PaymentStore {
    /// Step 1 of a refund: answers it from pagos' own rows when they settle it (claiming
    /// `event_id` for `consumer` with the answer), or says the gateway must be asked.
    pub async fn begin_refund(
        &self,
        consumer: &str,
        event_id: &str,
        request: &RefundRequest,
        now_ms: i64,
    ) -> Result<RefundStart, StoreError> {
        let mut tx = self.db().begin().await?;
        let row: Option<(String, i64)> = tx
            .fetch_optional(
                query("SELECT estado, importe_centimos FROM pagos WHERE pedido_id = $1")
                    .bind(request.order_id.as_str()),
            )
            .await?;
        let cents = match row.as_ref().map(|(s, c)| (PaymentState::parse(s), *c)) {
            Some((Some(PaymentState::Started | PaymentState::Confirmed), _)) => {
                tx.rollback().await?;
                return Ok(RefundStart::Call);
            }
            Some((Some(PaymentState::Refunded), cents)) => cents,
            Some(_) => 0,
            None => {
                // Never asked to charge: nothing was, and nothing will be.
                tx.execute(
                    query(
                        "INSERT INTO pagos (pedido_id, importe_centimos, tarjeta, \
                         clave_idempotencia, estado, motivo, actualizado_ms) \
                         VALUES ($1, 0, '', $2, $3, $4, $5)",
                    )
                    .bind(request.order_id.as_str())
                    .bind(request.charge_key())
                    .bind(PaymentState::Cancelled.as_str())
                    .bind("reembolso pedido antes del cobro")
                    .bind(now_ms),
                )
                .await?;
                0
            }
        };
        tx.claim(consumer, event_id).await?;
        tx.enqueue(&refunded_event(request, cents)?).await?;
        tx.commit().await?;
        Ok(RefundStart::Answered)
    }

    /// Step 3 of a refund: the gateway's answer on the `pagos` row (refunded, or cancelled
    /// when nothing had been charged) with `pago.reembolsado`, and `event_id` claimed for
    /// `consumer`, in one transaction.
    pub async fn finish_refund(
        &self,
        consumer: &str,
        event_id: &str,
        request: &RefundRequest,
        outcome: RefundOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.db().begin().await?;
        tx.claim(consumer, event_id).await?;
        let (state, cents) = match outcome {
            RefundOutcome::Refunded(cents) => (PaymentState::Refunded, cents),
            RefundOutcome::NothingCharged => (PaymentState::Cancelled, 0),
        };
        tx.execute(
            query(
                "UPDATE pagos SET estado = $1, actualizado_ms = $2 \
                 WHERE pedido_id = $3 AND estado IN ('iniciado', 'confirmado')",
            )
            .bind(state.as_str())
            .bind(now_ms)
            .bind(request.order_id.as_str()),
        )
        .await?;
        tx.enqueue(&refunded_event(request, cents)?).await?;
        failpoint_before_commit()?;
        tx.commit().await
    }

    /// Records that a charge which landed after its order was cancelled has been given back
    /// at once (`reembolsado`, with the charge's reference).
    pub async fn record_late_refund(
        &self,
        order_id: &str,
        gateway_ref: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.db()
            .execute(
                query(
                    "UPDATE pagos SET estado = $1, ref_pasarela = $2, actualizado_ms = $3 \
                     WHERE pedido_id = $4",
                )
                .bind(PaymentState::Refunded.as_str())
                .bind(gateway_ref)
                .bind(now_ms)
                .bind(order_id),
            )
            .await
            .map(drop)
    }
}
