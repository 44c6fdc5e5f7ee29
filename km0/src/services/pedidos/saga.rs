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
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::domain::{InvalidOrder, NewOrder, OrderState};
use super::messaging::AGGREGATE;
use crate::contracts::delivery::Assigned;
use crate::contracts::orders::{OrderCancelled, OrderPaid, StreetAddress};
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
        let input = SagaInput {
            lines: order
                .lines
                .iter()
                .map(|l| StockLine {
                    product: l.product.clone(),
                    quantity: l.quantity,
                })
                .collect(),
            amount_cents: order.amount_cents(),
            card: order
                .card
                .clone()
                .unwrap_or_else(|| format!("tok_{}", order.customer)),
            address: SagaAddress {
                city: address.city.clone(),
                street: address.street.clone(),
                postal_code: Some(address.postal_code.clone()),
            },
        };
        serde_json::to_value(input).map_err(|e| InvalidOrder {
            field: "cuerpo".into(),
            message: e.to_string(),
        })
    }
}

/// What an order's saga starts with, stored in `entrega_sagas.input`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SagaInput {
    /// What to reserve (`lineas`).
    #[serde(rename = "lineas")]
    lines: Vec<StockLine>,
    /// What to charge (`importe_centimos`).
    #[serde(rename = "importe_centimos")]
    amount_cents: i64,
    /// The card to charge (`tarjeta`).
    #[serde(rename = "tarjeta")]
    card: String,
    /// Where the courier goes (`direccion_entrega`).
    #[serde(rename = "direccion_entrega")]
    address: SagaAddress,
}

/// The delivery address in a saga's input; sagas stored before postal codes have none.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SagaAddress {
    #[serde(rename = "ciudad")]
    city: String,
    #[serde(rename = "calle")]
    street: String,
    #[serde(
        rename = "codigo_postal",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    postal_code: Option<String>,
}

/// What every answer to a saga's command carries: the order, the command's key and, when
/// refused, why.
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(rename = "pedido_id")]
    order_id: String,
    #[serde(rename = "clave")]
    key: String,
    #[serde(rename = "motivo", default)]
    reason: Option<String>,
}

fn input_of(saga: &SagaRecord) -> Result<SagaInput, FlowError> {
    serde_json::from_value(saga.input.clone())
        .map_err(|e| FlowError::new(format!("saga {}: unreadable input: {e}", saga.id)))
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
        let input = input_of(saga)?;
        match step {
            0 => ReserveCommand {
                order_id,
                reservation_id: key.to_owned(),
                lines: input.lines,
            }
            .event(),
            1 => pagos::charge_command(&OrderToCharge {
                order_id,
                amount_cents: input.amount_cents,
                card: input.card,
            }),
            2 => AssignCommand {
                order_id,
                key: key.to_owned(),
                city: input.address.city,
                street: input.address.street,
            }
            .event(),
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
        let (step, phase, refused) = match envelope.kind.as_str() {
            inventario::RESERVED => ("reserva", Phase::Action, false),
            inventario::REFUSED => ("reserva", Phase::Action, true),
            inventario::RELEASED => ("reserva", Phase::Compensation, false),
            pagos::PAYMENT_CONFIRMED => ("cobro", Phase::Action, false),
            pagos::PAYMENT_DECLINED => ("cobro", Phase::Action, true),
            pagos::PAYMENT_REFUNDED => ("cobro", Phase::Compensation, false),
            reparto::ASSIGNED => ("reparto", Phase::Action, false),
            reparto::REFUSED => ("reparto", Phase::Action, true),
            _ => return Ok(None),
        };
        let answer: Answer = serde_json::from_value(envelope.data.clone())
            .map_err(|e| FlowError::new(format!("{}: {e}", envelope.kind)))?;
        let outcome = if refused {
            StepOutcome::Failed {
                reason: answer.reason.unwrap_or_else(|| envelope.kind.clone()),
                transient: false,
            }
        } else {
            StepOutcome::Done(envelope.data.clone())
        };
        Ok(Some(Reply {
            saga_id: answer.order_id,
            step: step.to_owned(),
            phase,
            key: answer.key,
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
    let missing = |field: &str, e: String| ContractError::Invalid {
        tipo: OrderPaid::TIPO.to_owned(),
        version: OrderPaid::VERSION,
        field: field.to_owned(),
        reason: format!("not in the saga's record: {e}"),
    };
    let input: SagaInput =
        serde_json::from_value(saga.input.clone()).map_err(|e| missing("datos", e.to_string()))?;
    let assigned = saga.results.get("reparto").cloned().unwrap_or(Value::Null);
    let assigned: Assigned =
        serde_json::from_value(assigned).map_err(|e| missing("repartidor_id", e.to_string()))?;
    Ok(OrderPaid {
        order_id: saga.id.clone(),
        amount_cents: input.amount_cents,
        address: StreetAddress {
            city: input.address.city,
            street: input.address.street,
        },
        courier_id: assigned.courier_id,
    })
}
