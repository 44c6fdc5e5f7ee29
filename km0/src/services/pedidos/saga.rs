//! The order saga, orchestrated by pedidos: reserve the stock (inventario), charge the order
//! (pagos, through the gateway with its Idempotency-Key), assign a courier (reparto); then
//! the order is `pagado` and `pedido.pagado` goes out. A step refused for good (no stock, a
//! declined card, a city without couriers), a deadline or a customer's cancel undoes what
//! was done, newest first: the refund (`reembolso-<pedido>`), then the release
//! (`liberacion-<pedido>`); the order is `cancelado` and `pedido.cancelado` goes out.
//!
//! The saga's state is in pedidos' database (`entrega_sagas`), started in the transaction
//! that stores the order.

use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{query, Tx};
use entrega::saga::{Ending, FlowError, Phase, Reply, SagaFlow, SagaRecord, StepOutcome, StepSpec};
use entrega::{Backoff, ContractError, Event};
use entrega_core::{Envelope, NewEvent, StoreError};
use serde_json::{json, Value};

use super::domain::{InvalidOrder, NewOrder, OrderState};
use super::messaging::AGGREGATE;
use crate::contracts::orders::{OrderCancelled, OrderPaid};
use crate::services::inventario::{self, ReleaseCommand, ReserveCommand, StockLine};
use crate::services::pagos::{self, OrderToCharge, RefundRequest};
use crate::services::reparto::{self, AssignCommand};

/// The saga type in `entrega_sagas.kind`.
pub const SAGA_KIND: &str = "pedido";

/// How long each step may take, and how its commands are sent again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SagaTimings {
    /// Deadline of the reservation and of the charge.
    pub step_deadline: Duration,
    /// Deadline of the courier's assignment (a courier may free up meanwhile).
    pub delivery_deadline: Duration,
    /// Resends of a command or compensation without an answer.
    pub resend: Backoff,
    /// Sends of a compensation before an operator is needed.
    pub compensation_attempts: u32,
}

impl Default for SagaTimings {
    /// 30 s per step, 20 min for a courier (the seed's "no free courier for 20 minutes"),
    /// resends after 2, 4, 8 ... up to 30 s, 10 sends of a compensation.
    fn default() -> Self {
        Self {
            step_deadline: Duration::from_secs(30),
            delivery_deadline: Duration::from_secs(20 * 60),
            resend: Backoff::new(Duration::from_secs(2), Duration::from_secs(30)).with_jitter(0.1),
            compensation_attempts: 10,
        }
    }
}

/// The order saga's flow.
#[derive(Debug, Clone)]
pub struct OrderSaga {
    steps: Vec<StepSpec>,
}

impl OrderSaga {
    /// The flow with `timings`.
    pub fn new(timings: SagaTimings) -> Self {
        let step = |name, prefix, deadline| {
            StepSpec::new(name, prefix)
                .resend(timings.resend)
                .deadline(deadline)
                .compensation_attempts(timings.compensation_attempts)
        };
        Self {
            steps: vec![
                step("reserva", "reserva", timings.step_deadline).compensated_by("liberacion"),
                step("cobro", "cobro", timings.step_deadline).compensated_by("reembolso"),
                step("reparto", "reparto", timings.delivery_deadline),
            ],
        }
    }

    /// What a saga of `order` starts with: its lines, amount, card and delivery address
    /// (required here: the courier needs it).
    pub fn input(order: &NewOrder) -> Result<Value, InvalidOrder> {
        let Some(address) = &order.address else {
            return Err(InvalidOrder {
                field: "direccion_entrega".into(),
                message: "falta el campo: el reparto la necesita".into(),
            });
        };
        let lines: Vec<Value> = order
            .lines
            .iter()
            .map(|l| json!({"producto": l.product, "cantidad": l.quantity}))
            .collect();
        let card = order
            .card
            .clone()
            .unwrap_or_else(|| format!("tok_{}", order.customer));
        Ok(json!({
            "lineas": lines,
            "importe_centimos": order.amount_cents(),
            "tarjeta": card,
            "direccion_entrega": {"ciudad": address.city, "calle": address.street},
        }))
    }
}

fn field<'a>(saga: &'a SagaRecord, name: &str) -> Result<&'a Value, FlowError> {
    saga.input
        .get(name)
        .ok_or_else(|| FlowError::new(format!("saga {} has no `{name}`", saga.id)))
}

fn text_of(value: &Value, name: &str) -> Result<String, FlowError> {
    value
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| FlowError::new(format!("`{name}` missing or not text")))
}

fn lines_of(saga: &SagaRecord) -> Result<Vec<StockLine>, FlowError> {
    let lines = field(saga, "lineas")?
        .as_array()
        .ok_or_else(|| FlowError::new("`lineas` is not a list"))?;
    lines
        .iter()
        .map(|l| {
            Ok(StockLine {
                product: text_of(l, "producto")?,
                quantity: l
                    .get("cantidad")
                    .and_then(Value::as_i64)
                    .and_then(|q| i32::try_from(q).ok())
                    .ok_or_else(|| FlowError::new("`cantidad` is not a number"))?,
            })
        })
        .collect()
}

#[async_trait]
impl SagaFlow for OrderSaga {
    fn kind(&self) -> &str {
        SAGA_KIND
    }

    fn steps(&self) -> &[StepSpec] {
        &self.steps
    }

    fn command(&self, saga: &SagaRecord, step: usize, key: &str) -> Result<NewEvent, FlowError> {
        let order_id = saga.id.clone();
        match step {
            0 => ReserveCommand {
                order_id,
                reservation_id: key.to_owned(),
                lines: lines_of(saga)?,
            }
            .event(),
            1 => pagos::charge_command(&OrderToCharge {
                order_id,
                amount_cents: field(saga, "importe_centimos")?
                    .as_i64()
                    .ok_or_else(|| FlowError::new("`importe_centimos` is not a number"))?,
                card: text_of(&saga.input, "tarjeta")?,
            }),
            2 => {
                let address = field(saga, "direccion_entrega")?;
                AssignCommand {
                    order_id,
                    key: key.to_owned(),
                    city: text_of(address, "ciudad")?,
                    street: text_of(address, "calle")?,
                }
                .event()
            }
            _ => return Err(FlowError::new(format!("no step {step}"))),
        }
        .map_err(|e| FlowError::new(e.to_string()))
    }

    fn compensation(
        &self,
        saga: &SagaRecord,
        step: usize,
        key: &str,
    ) -> Result<NewEvent, FlowError> {
        let order_id = saga.id.clone();
        match step {
            0 => ReleaseCommand {
                reservation_id: inventario::reservation_id(&order_id),
                order_id,
                key: key.to_owned(),
            }
            .event(),
            1 => pagos::refund_command(&RefundRequest {
                order_id,
                key: key.to_owned(),
            }),
            _ => return Err(FlowError::new(format!("step {step} has no compensation"))),
        }
        .map_err(|e| FlowError::new(e.to_string()))
    }

    fn reply(&self, envelope: &Envelope) -> Result<Option<Reply>, FlowError> {
        let failed = |transient| StepOutcome::Failed {
            reason: text_of(&envelope.data, "motivo").unwrap_or_else(|_| envelope.kind.clone()),
            transient,
        };
        let done = StepOutcome::Done(envelope.data.clone());
        let (step, phase, outcome) = match envelope.kind.as_str() {
            inventario::RESERVED => ("reserva", Phase::Action, done),
            inventario::REFUSED => ("reserva", Phase::Action, failed(false)),
            inventario::RELEASED => ("reserva", Phase::Compensation, done),
            pagos::PAYMENT_CONFIRMED => ("cobro", Phase::Action, done),
            pagos::PAYMENT_DECLINED => ("cobro", Phase::Action, failed(false)),
            pagos::PAYMENT_REFUNDED => ("cobro", Phase::Compensation, done),
            reparto::ASSIGNED => ("reparto", Phase::Action, done),
            reparto::REFUSED => ("reparto", Phase::Action, failed(false)),
            _ => return Ok(None),
        };
        Ok(Some(Reply {
            saga_id: text_of(&envelope.data, "pedido_id")?,
            step: step.to_owned(),
            phase,
            key: text_of(&envelope.data, "clave")?,
            outcome,
        }))
    }

    async fn finished(
        &self,
        tx: &mut Tx,
        saga: &SagaRecord,
        ending: &Ending,
    ) -> Result<(), StoreError> {
        let (state, event) = match ending {
            Ending::Completed => (OrderState::Paid, paid(saga)?.outgoing(AGGREGATE, &saga.id)?),
            Ending::Compensated { reason } => (
                OrderState::Cancelled,
                OrderCancelled {
                    order_id: saga.id.clone(),
                    reason: reason.clone(),
                }
                .outgoing(AGGREGATE, &saga.id)?,
            ),
        };
        tx.execute(
            query("UPDATE pedidos SET estado = $1 WHERE id = $2")
                .bind(state.as_str())
                .bind(saga.id.as_str()),
        )
        .await?;
        tx.enqueue(&event).await
    }
}

/// The `pedido.pagado` of a completed saga: its amount and address from the saga's input, the
/// courier from reparto's answer.
fn paid(saga: &SagaRecord) -> Result<OrderPaid, ContractError> {
    fn member<T: serde::de::DeserializeOwned>(
        value: Option<&Value>,
        field: &str,
    ) -> Result<T, ContractError> {
        serde_json::from_value(value.cloned().unwrap_or(Value::Null)).map_err(|e| {
            ContractError::Invalid {
                tipo: OrderPaid::TIPO.to_owned(),
                version: OrderPaid::VERSION,
                field: field.to_owned(),
                reason: format!("not in the saga's record: {e}"),
            }
        })
    }
    Ok(OrderPaid {
        order_id: saga.id.clone(),
        amount_cents: member(saga.input.get("importe_centimos"), "importe_centimos")?,
        address: member(saga.input.get("direccion_entrega"), "direccion_entrega")?,
        courier_id: member(
            saga.results
                .get("reparto")
                .and_then(|r| r.get("repartidor_id")),
            "repartidor_id",
        )?,
    })
}
