//! Sagas: a business transaction across services as a sequence of their local transactions,
//! each asked for by a command and answered by a reply, undone by compensations in reverse
//! order when a step fails for good, misses its deadline, or the saga is cancelled.
//!
//! The orchestrator's state lives in its own database (`entrega_sagas`, and every step's
//! history in `entrega_saga_history`) and changes only in the transaction that also
//! enqueues the commands it sends (the outbox) and claims the inbox key of the reply that
//! caused the change. A crash at any point leaves either the old state with the reply still
//! to be delivered, or the new state with its commands on their way: never one without the
//! other.
//!
//! - Keys are deterministic (`reserva-<pedido>`, `cobro-<pedido>`, `reembolso-<pedido>`):
//!   a command sent again, or delivered twice, is recognised by the service that applies it.
//! - A transient failure or a missing reply is sent again with backoff until the step's
//!   deadline; only a permanent failure or the deadline compensates. A step that timed out
//!   is compensated too: no reply does not mean no effect.
//! - A compensation is sent again until it succeeds; past its limit the saga waits for an
//!   operator ([`SagaStatus::NeedsOperator`], counted in [`SagaStats`]), who can
//!   [`Sagas::retry`] it.
//! - Replies that are late, repeated or under another key are recorded and ignored; a
//!   cancel while the saga runs compensates, a cancel after it completed is refused: one
//!   outcome, never both. A step without a compensation is the point of no return: a cancel
//!   while its command is out is refused too, since its effect could not be undone.
//! - Several orchestrators may share the tables: a saga row is locked while it changes
//!   (PostgreSQL), timers skip rows another one holds, and every write checks the version it
//!   read.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use entrega::saga::{FlowError, Phase, Reply, SagaFlow, SagaRecord, Sagas, StepOutcome, StepSpec};
//! use entrega::{Db, Envelope, NewEvent, SystemClock};
//! use serde_json::json;
//!
//! /// Reserve the stock, then charge; a refused charge releases the stock.
//! struct Order {
//!     steps: Vec<StepSpec>,
//! }
//!
//! #[async_trait::async_trait]
//! impl SagaFlow for Order {
//!     fn kind(&self) -> &str {
//!         "pedido"
//!     }
//!
//!     fn steps(&self) -> &[StepSpec] {
//!         &self.steps
//!     }
//!
//!     fn command(&self, saga: &SagaRecord, step: usize, key: &str) -> Result<NewEvent, FlowError> {
//!         let tipo = ["inventario.reservar", "pagos.cobrar"][step];
//!         let datos = json!({"pedido_id": saga.id, "clave": key, "pedido": saga.input});
//!         Ok(NewEvent::new("pedido", &saga.id, tipo, datos))
//!     }
//!
//!     fn compensation(&self, saga: &SagaRecord, _: usize, key: &str) -> Result<NewEvent, FlowError> {
//!         let datos = json!({"pedido_id": saga.id, "clave": key});
//!         Ok(NewEvent::new("pedido", &saga.id, "inventario.liberar", datos))
//!     }
//!
//!     fn reply(&self, envelope: &Envelope) -> Result<Option<Reply>, FlowError> {
//!         let (step, phase, done) = match envelope.kind.as_str() {
//!             "reserva.confirmada" => ("reserva", Phase::Action, true),
//!             "reserva.rechazada" => ("reserva", Phase::Action, false),
//!             "pago.confirmado" => ("cobro", Phase::Action, true),
//!             "pago.rechazado" => ("cobro", Phase::Action, false),
//!             "reserva.liberada" => ("reserva", Phase::Compensation, true),
//!             _ => return Ok(None),
//!         };
//!         let text = |name: &str| envelope.data[name].as_str().map(str::to_owned);
//!         let (Some(saga_id), Some(key)) = (text("pedido_id"), text("clave")) else {
//!             return Err(FlowError::new("a reply without `pedido_id` or `clave`"));
//!         };
//!         let outcome = if done {
//!             StepOutcome::Done(envelope.data.clone())
//!         } else {
//!             StepOutcome::Failed { reason: text("motivo").unwrap_or_default(), transient: false }
//!         };
//!         Ok(Some(Reply { saga_id, step: step.into(), phase, key, outcome }))
//!     }
//! }
//!
//! # async fn run(db: Db) -> Result<(), Box<dyn std::error::Error>> {
//! let flow = Order {
//!     steps: vec![
//!         StepSpec::new("reserva", "reserva").compensated_by("liberacion"),
//!         StepSpec::new("cobro", "cobro"),
//!     ],
//! };
//! let sagas = Sagas::new(db.clone(), Arc::new(flow), Arc::new(SystemClock));
//! let mut tx = db.begin().await?;
//! // ... the order written in `tx` ...
//! sagas.start_in(&mut tx, "P-1", json!({"lineas": [["queso", 2]]})).await?;
//! tx.commit().await?; // the order, the saga and its first command together
//! // Replies reach `sagas.handle(&envelope)` from a worker (`Sagas` is a `Handler`), and
//! // `sagas.run_timers(...)` resends and compensates on time.
//! # Ok(()) }
//! ```

mod batch;
mod engine;
mod error;
mod flow;
mod machine;
mod record;
mod runner;
mod stats;
mod store;

#[cfg(test)]
mod machine_tests;

pub use engine::{CancelOutcome, ReplyOutcome, Sagas, Started};
pub use error::SagaError;
pub use flow::{Ending, FlowError, Reply, SagaFlow, StepOutcome, StepSpec};
pub use record::{EventKind, HistoryEntry, Phase, SagaRecord, SagaStatus};
pub use stats::{SagaStats, SagaStatsSnapshot};
