//! The order saga's commands to inventario: reserve an order's stock, release it. Each is
//! applied in one transaction with its answer in the outbox; a repeated command (the saga
//! sent it again) gets the same answer again without touching the stock.

use std::sync::Arc;

use async_trait::async_trait;
use entrega::{apply_all_or_each, ApplyAll, Handler, Message, Router, Tx};
use entrega_core::{now_ms, HandlerError, Processed};

use super::db::{before_commit, ApplyError, StockStore};
use super::domain::StockError;
use super::reservations::{
    release_answer, reservation_answer, Motive, ReleaseCommand, ReservationState, ReserveCommand,
    RELEASE, RESERVE,
};
use super::stock_moves::{self, Released, Reserved};

/// Who claims command events in `mensajes_procesados`.
pub const COMMANDS_CONSUMER: &str = "inventario.reservas";
/// The consumer group of inventario's commands.
pub const COMMANDS_GROUP: &str = "inventario-reservas";

impl StockStore {
    /// Applies a reservation once per `id_reserva` and enqueues its answer: confirmed,
    /// refused with the reason (recorded, so a repeat is refused the same way), or refused
    /// because it was released before it was made.
    pub async fn reserve(
        &self,
        message_id: &str,
        command: &ReserveCommand,
    ) -> Result<Processed<Reserved>, ApplyError> {
        self.db()
            .once(COMMANDS_CONSUMER, message_id, async |tx| {
                reserve_in(tx, command).await
            })
            .await
    }

    /// Releases a reservation once and enqueues `reserva.liberada` (also when there was
    /// nothing to give back).
    pub async fn release(
        &self,
        message_id: &str,
        command: &ReleaseCommand,
    ) -> Result<Processed<Released>, ApplyError> {
        self.db()
            .once(COMMANDS_CONSUMER, message_id, async |tx| {
                release_in(tx, command).await
            })
            .await
    }

    /// The reservation `id` as stored, if any.
    pub async fn reservation(
        &self,
        id: &str,
    ) -> Result<Option<stock_moves::StoredReservation>, ApplyError> {
        Ok(stock_moves::read(self.db(), id).await?)
    }
}

/// A reservation and its answer, in `tx` (whose caller claimed the command's key).
async fn reserve_in(tx: &mut Tx, command: &ReserveCommand) -> Result<Reserved, ApplyError> {
    let outcome = stock_moves::reserve(
        tx,
        &command.reservation_id,
        &command.order_id,
        &command.lines,
        Motive::Reservation,
        true,
        now_ms(),
    )
    .await?;
    let refused = match &outcome {
        Reserved::Taken => None,
        Reserved::Refused(reason) => Some(reason.clone()),
        Reserved::Existing(r) => match r.state {
            ReservationState::Held => None,
            ReservationState::Refused => {
                Some(r.reason.clone().unwrap_or_else(|| "rechazada".into()))
            }
            ReservationState::Released => Some("reserva liberada antes de hacerse".into()),
        },
    };
    tx.enqueue(&reservation_answer(command, refused.as_deref())?)
        .await?;
    before_commit()?;
    Ok(outcome)
}

/// A release and its answer, in `tx` (whose caller claimed the command's key).
async fn release_in(tx: &mut Tx, command: &ReleaseCommand) -> Result<Released, ApplyError> {
    let outcome =
        stock_moves::release(tx, &command.reservation_id, &command.order_id, now_ms()).await?;
    tx.enqueue(&release_answer(command)?).await?;
    before_commit()?;
    Ok(outcome)
}

/// Commands applied in one transaction at most. A reservation opens a savepoint, and
/// PostgreSQL keeps the subtransactions of one transaction in a shared cache of 64: past it,
/// every other session's snapshot grows costly while the transaction is open.
const COMMANDS_PER_TX: usize = 50;

/// A command read from its event.
enum Command {
    Reserve(ReserveCommand),
    Release(ReleaseCommand),
}

impl Command {
    fn of(msg: &Message) -> Result<Self, HandlerError> {
        let command = if msg.envelope.kind == RELEASE {
            Self::Release(
                ReleaseCommand::from_envelope(&msg.envelope)
                    .map_err(StockError::into_handler_error)?,
            )
        } else {
            Self::Reserve(
                ReserveCommand::from_envelope(&msg.envelope)
                    .map_err(StockError::into_handler_error)?,
            )
        };
        Ok(command)
    }
}

/// Applies the saga's `inventario.reservar` and `inventario.liberar`.
#[derive(Debug, Clone)]
pub struct CommandConsumer {
    store: StockStore,
}

impl CommandConsumer {
    /// Commands applied to `store`.
    pub fn new(store: StockStore) -> Self {
        Self { store }
    }

    /// Both commands to this consumer; anything else on the topic is dead-lettered.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new()
            .route(RESERVE, handler.clone())
            .route(RELEASE, handler)
    }
}

fn classify(e: ApplyError) -> HandlerError {
    match e {
        ApplyError::Stock(e) => e.into_handler_error(),
        ApplyError::Store(e) => HandlerError::from(e),
    }
}

#[async_trait]
impl ApplyAll for CommandConsumer {
    fn per_tx(&self) -> usize {
        COMMANDS_PER_TX
    }

    /// Applies `run` in one transaction, all or nothing (an unreadable one fails the lot).
    async fn apply_all(&self, run: &[Message]) -> Result<(), HandlerError> {
        let commands = run
            .iter()
            .map(|m| Ok((m.id(), m.trace, Command::of(m)?)))
            .collect::<Result<Vec<_>, HandlerError>>()?;
        let keys: Vec<&str> = commands.iter().map(|(id, _, _)| id.as_str()).collect();
        let mut batch = self
            .store
            .db()
            .claim_batch(COMMANDS_CONSUMER, &keys)
            .await?;
        for (id, trace, command) in &commands {
            if !batch.is_new(id) {
                continue;
            }
            let tx = batch.tx();
            let apply = async {
                match command {
                    Command::Reserve(c) => reserve_in(tx, c).await.map(drop),
                    Command::Release(c) => release_in(tx, c).await.map(drop),
                }
            };
            // On an error the batch is dropped, and rolled back, with every claim.
            entrega::trace::scope(*trace, apply)
                .await
                .map_err(classify)?;
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
        if msg.envelope.kind == RELEASE {
            let command = ReleaseCommand::from_envelope(&msg.envelope)
                .map_err(StockError::into_handler_error)?;
            self.store
                .release(&msg.id(), &command)
                .await
                .map_err(classify)?;
        } else {
            let command = ReserveCommand::from_envelope(&msg.envelope)
                .map_err(StockError::into_handler_error)?;
            self.store
                .reserve(&msg.id(), &command)
                .await
                .map_err(classify)?;
        }
        Ok(())
    }
}
