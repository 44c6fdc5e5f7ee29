//! The order saga's commands to pagos on `pagos.comandos`: charge an order (`pagos.cobrar`)
//! and give its charge back (`pagos.reembolsar`). Each is answered on `pagos.eventos` under
//! its key, again when the command is repeated: `pago.confirmado` / `pago.rechazado`
//! (`cobro-<pedido>`) and `pago.reembolsado` (`reembolso-<pedido>`).
//!
//! Order matters here, and the saga keeps one order's commands on one key, so they are
//! applied in order. When a refund still overtakes its charge (a charge being retried aside),
//! the refund marks the order `anulado` and the charge is refused without calling the
//! gateway; a charge already at the gateway that lands after the refund is given back at
//! once under `reembolso-tardio-<pedido>`.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use entrega::{apply_all_or_each, ApplyAll, ContractError, Event, Handler, Message, Router};
use entrega_core::{now_ms, Envelope, HandlerError, NewEvent};
use futures::future::try_join_all;

use crate::contracts::{self, payments};

use super::db::{
    begin_in, enqueue_result, failpoint_before_commit, finish_in, ChargeOutcome, ChargeStart,
    PaymentState, PaymentStore,
};
use super::domain::{NotChargeable, OrderToCharge};
use super::gateway::{Gateway, GatewayError};
use super::refunds::{RefundOutcome, RefundRequest, RefundStart};

/// The topic of pagos' commands.
pub const COMMANDS_TOPIC: &str = "pagos.comandos";
/// Charge an order (`pagos.cobrar`).
pub const CHARGE: &str = "pagos.cobrar";
/// Give an order's charge back (`pagos.reembolsar`).
pub const REFUND: &str = "pagos.reembolsar";
/// The consumer group of pagos' commands.
pub const COMMANDS_GROUP: &str = "pagos-comandos";
/// Who claims command events in `mensajes_procesados`.
pub const COMMANDS_CONSUMER: &str = "pagos.comandos";
/// The aggregate of pagos' commands in the orchestrator's outbox (keyed by order).
pub const COMMAND_AGGREGATE: &str = "cobro";

/// The `pagos.cobrar` event for `order`: `{"pedido_id", "clave", "importe_centimos", "tarjeta"}`.
pub fn charge_command(order: &OrderToCharge) -> Result<NewEvent, ContractError> {
    payments::Charge {
        order_id: order.order_id.clone(),
        key: order.charge_key(),
        amount_cents: order.amount_cents,
        card: order.card.clone(),
    }
    .outgoing(COMMAND_AGGREGATE, &order.order_id)
}

/// The `pagos.reembolsar` event: `{"pedido_id", "clave"}`.
pub fn refund_command(request: &RefundRequest) -> Result<NewEvent, ContractError> {
    payments::Refund {
        order_id: request.order_id.clone(),
        key: request.key.clone(),
    }
    .outgoing(COMMAND_AGGREGATE, &request.order_id)
}

fn charge_of(envelope: &Envelope) -> Result<OrderToCharge, HandlerError> {
    let command: payments::Charge = contracts::upcasters()
        .decode(envelope)
        .map_err(HandlerError::contract)?;
    let order = OrderToCharge {
        order_id: command.order_id,
        amount_cents: command.amount_cents,
        card: command.card,
    };
    let refuse = |reason: String| HandlerError::permanent(NotChargeable(reason));
    if order.order_id.trim().is_empty() || order.card.trim().is_empty() {
        return Err(refuse("pedido_id y tarjeta no pueden estar vacíos".into()));
    }
    if order.amount_cents <= 0 {
        return Err(refuse("importe_centimos debe ser > 0".into()));
    }
    if command.key != order.charge_key() {
        return Err(refuse(format!("clave distinta de {}", order.charge_key())));
    }
    Ok(order)
}

fn refund_of(envelope: &Envelope) -> Result<RefundRequest, HandlerError> {
    let command: payments::Refund = contracts::upcasters()
        .decode(envelope)
        .map_err(HandlerError::contract)?;
    Ok(RefundRequest {
        order_id: command.order_id,
        key: command.key,
    })
}

fn gateway_error(e: GatewayError) -> HandlerError {
    if e.is_transient() {
        HandlerError::transient(e)
    } else {
        HandlerError::permanent(e)
    }
}

/// Applies pagos' commands through the gateway.
#[derive(Debug)]
pub struct CommandConsumer {
    store: PaymentStore,
    gateway: Gateway,
}

impl CommandConsumer {
    /// Commands applied to `store` through `gateway`.
    pub fn new(store: PaymentStore, gateway: Gateway) -> Self {
        Self { store, gateway }
    }

    /// Both commands to this consumer; anything else on the topic is dead-lettered.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new()
            .route(CHARGE, handler.clone())
            .route(REFUND, handler)
    }

    async fn charge(&self, id: &str, order: &OrderToCharge) -> Result<(), HandlerError> {
        if self.store.begin_charge(order, now_ms()).await? == ChargeStart::Call {
            // No transaction is open here: the gateway may take seconds.
            let outcome = self.gateway.charge(order).await.map_err(gateway_error)?;
            let store = &self.store;
            if store
                .finish_charge_as(COMMANDS_CONSUMER, id, order, &outcome, now_ms())
                .await?
            {
                return Ok(());
            }
            if let ChargeOutcome::Approved(gateway_ref) = &outcome {
                self.give_back_late(order, gateway_ref).await?;
            }
        }
        self.answer_settled(id, order).await
    }

    /// A charge that landed on an order cancelled meanwhile: given back at once.
    async fn give_back_late(
        &self,
        order: &OrderToCharge,
        gateway_ref: &str,
    ) -> Result<(), HandlerError> {
        let payment = self.store.payment(&order.order_id).await?;
        let cancelled = payment
            .is_some_and(|p| matches!(p.state, PaymentState::Cancelled | PaymentState::Refunded));
        if !cancelled {
            return Ok(());
        }
        let late = RefundRequest {
            order_id: order.order_id.clone(),
            key: format!("reembolso-tardio-{}", order.order_id),
        };
        if let RefundOutcome::Refunded(_) =
            self.gateway.refund(&late).await.map_err(gateway_error)?
        {
            tracing::warn!(order = %order.order_id, "a charge landed after its order was cancelled: given back");
            self.store
                .record_late_refund(&order.order_id, gateway_ref, now_ms())
                .await?;
        }
        Ok(())
    }

    /// Answers a charge of an order settled before, with what it came to.
    async fn answer_settled(&self, id: &str, order: &OrderToCharge) -> Result<(), HandlerError> {
        let payment = self.store.payment(&order.order_id).await?;
        let outcome = match payment {
            Some(p) if p.state == PaymentState::Confirmed => {
                ChargeOutcome::Approved(p.gateway_ref.unwrap_or_default())
            }
            Some(p) if p.state == PaymentState::Declined => {
                ChargeOutcome::Declined(p.reason.unwrap_or_else(|| "rechazado".into()))
            }
            Some(p) if p.state == PaymentState::Started => {
                return Err(HandlerError::transient(NotChargeable(
                    "el cobro sigue en curso".into(),
                )))
            }
            _ => ChargeOutcome::Declined("pedido anulado".into()),
        };
        let mut tx = self.store.db().begin().await?;
        if tx.claim(COMMANDS_CONSUMER, id).await? {
            enqueue_result(&mut tx, order, &outcome).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn refund(&self, id: &str, request: &RefundRequest) -> Result<(), HandlerError> {
        let store = &self.store;
        if store
            .begin_refund(COMMANDS_CONSUMER, id, request, now_ms())
            .await?
            == RefundStart::Answered
        {
            return Ok(());
        }
        let outcome = self.gateway.refund(request).await.map_err(gateway_error)?;
        store
            .finish_refund(COMMANDS_CONSUMER, id, request, outcome, now_ms())
            .await?;
        Ok(())
    }
}

/// Charges taken together, at most: as many gateway calls in flight at once.
const CHARGES_PER_BATCH: usize = 64;

/// Why a poll's charges are not taken together (they are then handled one by one).
#[derive(Debug, thiserror::Error)]
#[error("charges not taken together: {0}")]
struct NotPlain(&'static str);

fn not_plain(why: &'static str) -> HandlerError {
    HandlerError::transient(NotPlain(why))
}

#[async_trait]
impl ApplyAll for CommandConsumer {
    fn per_tx(&self) -> usize {
        CHARGES_PER_BATCH
    }

    /// The charges of one poll together: their intents in one transaction, the gateway
    /// called for all of them at once (no transaction open), their answers in one
    /// transaction with their keys. Only the plain case goes this way: every message a charge
    /// of a different order, each still to be sent to the gateway and settled by its answer.
    /// Anything else fails the batch, whose messages are then handled one by one; what it
    /// wrote before (intents, calls under each charge's idempotency key) is what those
    /// would write again.
    async fn apply_all(&self, run: &[Message]) -> Result<(), HandlerError> {
        let mut charges = Vec::with_capacity(run.len());
        let mut orders = HashSet::new();
        for msg in run {
            if msg.envelope.kind != CHARGE {
                return Err(not_plain("a refund among them"));
            }
            let order = charge_of(&msg.envelope)?;
            if !orders.insert(order.order_id.clone()) {
                return Err(not_plain("one order twice"));
            }
            charges.push((msg.id(), msg.trace, order));
        }
        let mut tx = self.store.db().begin().await?;
        let now = now_ms();
        for (_, _, order) in &charges {
            // On an error the transaction is dropped, and rolled back.
            if begin_in(&mut tx, order, now).await? != ChargeStart::Call {
                return Err(not_plain("a payment settled already"));
            }
        }
        tx.commit().await?;
        let calls = charges
            .iter()
            .map(|(_, trace, order)| entrega::trace::scope(*trace, self.gateway.charge(order)));
        let outcomes = try_join_all(calls).await.map_err(gateway_error)?;
        let keys: Vec<&str> = charges.iter().map(|(id, _, _)| id.as_str()).collect();
        let mut batch = self
            .store
            .db()
            .claim_batch(COMMANDS_CONSUMER, &keys)
            .await?;
        let now = now_ms();
        for ((id, trace, order), outcome) in charges.iter().zip(&outcomes) {
            if !batch.is_new(id) {
                continue;
            }
            let finish = finish_in(batch.tx(), order, outcome, now);
            // On an error or a refusal the batch is dropped, and rolled back, with every claim.
            if !entrega::trace::scope(*trace, finish).await? {
                return Err(not_plain("a payment settled meanwhile"));
            }
            failpoint_before_commit()?;
        }
        batch.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl Handler for CommandConsumer {
    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        apply_all_or_each(self, msgs).await
    }

    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        if msg.envelope.kind == REFUND {
            let request = refund_of(&msg.envelope)?;
            self.refund(&msg.id(), &request).await
        } else {
            let order = charge_of(&msg.envelope)?;
            self.charge(&msg.id(), &order).await
        }
    }
}
