//! The order saga's command to reparto: assign a courier to an order (`reparto.asignar` on
//! `reparto.comandos`), answered on `reparto.eventos` under the command's key:
//! `reparto.asignado` once a courier has it (at once, or when one frees up), or
//! `reparto.rechazado` for a city without couriers (the seed's exercise 3: the saga then
//! refunds and cancels). A repeated command gets the same answer again.

use std::sync::Arc;

use async_trait::async_trait;
use entrega::db::query;
use entrega::{apply_all_or_each, ApplyAll, ContractError, Event, Handler, Message, Router, Tx};
use entrega_core::{now_ms, Envelope, HandlerError, NewEvent, Processed, StoreError};
use futures::future::try_join_all;

use crate::contracts::orders::StreetAddress;
use crate::contracts::{self, delivery};

use super::db::{covered_cities, state_of, take_courier, DeliveryState, DeliveryStore};
use super::domain::{blank, DeliveryError};
use super::maps::{Maps, MapsError};

/// The topic of reparto's commands.
pub const COMMANDS_TOPIC: &str = "reparto.comandos";
/// The topic of reparto's answers.
pub const EVENTS_TOPIC: &str = "reparto.eventos";
/// Assign a courier (`reparto.asignar`).
pub const ASSIGN: &str = "reparto.asignar";
/// A courier has the order (`reparto.asignado`).
pub const ASSIGNED: &str = "reparto.asignado";
/// reparto cannot deliver the order (`reparto.rechazado`).
pub const REFUSED: &str = "reparto.rechazado";
/// The consumer group of reparto's commands.
pub const COMMANDS_GROUP: &str = "reparto-comandos";
/// Who claims command events in `mensajes_procesados`.
pub const COMMANDS_CONSUMER: &str = "reparto.comandos";
/// The aggregate of reparto's commands and answers in the outboxes (keyed by order).
pub const DELIVERY_AGGREGATE: &str = "entrega";

/// `reparto.asignar`: `{"pedido_id", "clave", "direccion_entrega": {"ciudad", "calle"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignCommand {
    /// The order.
    pub order_id: String,
    /// The command's key (`reparto-<pedido>`).
    pub key: String,
    /// Delivery city.
    pub city: String,
    /// Delivery street.
    pub street: String,
}

impl AssignCommand {
    /// Reads the command (`reparto.asignar`).
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, DeliveryError> {
        let command: delivery::Assign = contracts::upcasters()
            .decode(envelope)
            .map_err(DeliveryError::Schema)?;
        let tipo = delivery::Assign::TIPO;
        let field = |value: String, name: &str| {
            let value = value.trim().to_owned();
            if value.is_empty() || value.len() > 200 {
                Err(blank(tipo, envelope.version, name))
            } else {
                Ok(value)
            }
        };
        Ok(Self {
            order_id: field(command.order_id, "pedido_id")?,
            key: field(command.key, "clave")?,
            city: field(command.address.city, "direccion_entrega.ciudad")?,
            street: field(command.address.street, "direccion_entrega.calle")?,
        })
    }

    /// The command's event (what the order saga sends).
    pub fn event(&self) -> Result<NewEvent, ContractError> {
        delivery::Assign {
            order_id: self.order_id.clone(),
            key: self.key.clone(),
            address: StreetAddress {
                city: self.city.clone(),
                street: self.street.clone(),
            },
        }
        .outgoing(DELIVERY_AGGREGATE, &self.order_id)
    }
}

/// `reparto.asignado` `{"pedido_id", "clave", "repartidor_id"}`.
pub fn assigned_event(order_id: &str, key: &str, courier: &str) -> Result<NewEvent, ContractError> {
    delivery::Assigned {
        order_id: order_id.to_owned(),
        key: key.to_owned(),
        courier_id: courier.to_owned(),
    }
    .outgoing(DELIVERY_AGGREGATE, order_id)
}

/// `reparto.rechazado` `{"pedido_id", "clave", "motivo"}`.
pub fn refused_event(order_id: &str, key: &str, reason: &str) -> Result<NewEvent, ContractError> {
    delivery::AssignmentRefused {
        order_id: order_id.to_owned(),
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
    .outgoing(DELIVERY_AGGREGATE, order_id)
}

impl DeliveryStore {
    /// Applies an assignment once per order: a courier if one is free (answered at once),
    /// pending otherwise (answered when one frees up), refused for a city without couriers;
    /// an order known already is answered with what it came to. `km` is the route's length
    /// for a city served.
    pub async fn assign(
        &self,
        message_id: &str,
        command: &AssignCommand,
        km: Option<f64>,
        now_ms: i64,
    ) -> Result<Processed<DeliveryState>, StoreError> {
        self.db()
            .once(COMMANDS_CONSUMER, message_id, async |tx| {
                assign_in(tx, command, km, now_ms).await
            })
            .await
    }
}

/// An assignment and its answer, in `tx` (whose caller claimed the command's key); see
/// [`DeliveryStore::assign`].
async fn assign_in(
    tx: &mut Tx,
    command: &AssignCommand,
    km: Option<f64>,
    now_ms: i64,
) -> Result<DeliveryState, StoreError> {
    let known: Option<(String, Option<String>, Option<String>)> = tx
        .fetch_optional(
            query("SELECT estado, repartidor_id, motivo FROM entregas WHERE pedido_id = $1")
                .bind(&command.order_id),
        )
        .await?;
    let (order, key) = (&command.order_id, &command.key);
    let state = match known {
        Some((state, courier, reason)) => {
            let state = state_of(&state)?;
            let answer = match state {
                DeliveryState::Assigned | DeliveryState::Delivered => {
                    Some(assigned_event(order, key, &courier.unwrap_or_default())?)
                }
                DeliveryState::Refused => {
                    Some(refused_event(order, key, &reason.unwrap_or_default())?)
                }
                DeliveryState::Cancelled => Some(refused_event(order, key, "entrega_cancelada")?),
                DeliveryState::Pending => None,
            };
            if state == DeliveryState::Pending {
                tx.execute(
                    query("UPDATE entregas SET clave = $1 WHERE pedido_id = $2")
                        .bind(key)
                        .bind(order),
                )
                .await?;
            }
            if let Some(answer) = answer {
                tx.enqueue(&answer).await?;
            }
            state
        }
        None => {
            let (state, courier, reason) = match km {
                None => {
                    let reason = DeliveryError::CityNotServed {
                        city: command.city.clone(),
                        covered: covered_cities(tx).await?,
                    }
                    .to_string();
                    (DeliveryState::Refused, None, Some(reason))
                }
                Some(_) => match take_courier(tx, &command.city).await? {
                    Some(courier) => (DeliveryState::Assigned, Some(courier), None),
                    None => (DeliveryState::Pending, None, None),
                },
            };
            tx.execute(
                query(
                    "INSERT INTO entregas (pedido_id, ciudad, calle, km, repartidor_id, estado,
                                                       actualizado_ms, clave, motivo)
                                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(order)
                .bind(&command.city)
                .bind(&command.street)
                .bind(km)
                .bind(courier.clone())
                .bind(state.as_str())
                .bind(now_ms)
                .bind(key)
                .bind(reason.clone()),
            )
            .await?;
            match (state, courier, reason) {
                (DeliveryState::Assigned, Some(courier), _) => {
                    tx.enqueue(&assigned_event(order, key, &courier)?).await?;
                }
                (DeliveryState::Refused, _, Some(reason)) => {
                    tx.enqueue(&refused_event(order, key, &reason)?).await?;
                }
                _ => {}
            }
            state
        }
    };
    Ok(state)
}

/// Assignments applied in one transaction at most: as many routes asked for at once.
const ASSIGNMENTS_PER_TX: usize = 64;

/// Applies the saga's `reparto.asignar`.
pub struct CommandConsumer {
    store: DeliveryStore,
    maps: Arc<dyn Maps>,
}

impl std::fmt::Debug for CommandConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandConsumer")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl CommandConsumer {
    /// Assignments recorded in `store`, routes from `maps`.
    pub fn new(store: DeliveryStore, maps: Arc<dyn Maps>) -> Self {
        Self { store, maps }
    }

    /// The command to this consumer; anything else on the topic is dead-lettered.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new().route(ASSIGN, handler)
    }
}

impl CommandConsumer {
    /// The route's length for a new delivery in a city served; `None` otherwise (the route
    /// is asked for only then).
    async fn km_for(&self, command: &AssignCommand) -> Result<Option<f64>, HandlerError> {
        let known = self.store.delivery(&command.order_id).await?.is_some();
        if known || !self.store.serves(&command.city).await? {
            return Ok(None);
        }
        let km = self
            .maps
            .route_km(&command.city, &command.street)
            .await
            .map_err(MapsError::into_handler_error)?;
        Ok(Some(km))
    }
}

#[async_trait]
impl ApplyAll for CommandConsumer {
    fn per_tx(&self) -> usize {
        ASSIGNMENTS_PER_TX
    }

    /// Applies `run` in one transaction, all or nothing (an unreadable one fails the lot).
    /// Routes are asked for first, together, with no transaction open.
    async fn apply_all(&self, run: &[Message]) -> Result<(), HandlerError> {
        let commands = run
            .iter()
            .map(|m| {
                let command = AssignCommand::from_envelope(&m.envelope)
                    .map_err(DeliveryError::into_handler_error)?;
                Ok((m.id(), m.trace, command))
            })
            .collect::<Result<Vec<_>, HandlerError>>()?;
        let kms = try_join_all(commands.iter().map(|(_, _, c)| self.km_for(c))).await?;
        let keys: Vec<&str> = commands.iter().map(|(id, _, _)| id.as_str()).collect();
        let mut batch = self
            .store
            .db()
            .claim_batch(COMMANDS_CONSUMER, &keys)
            .await?;
        let now = now_ms();
        for ((id, trace, command), km) in commands.iter().zip(kms) {
            if !batch.is_new(id) {
                continue;
            }
            // On an error the batch is dropped, and rolled back, with every claim.
            entrega::trace::scope(*trace, assign_in(batch.tx(), command, km, now)).await?;
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
        let command = AssignCommand::from_envelope(&msg.envelope)
            .map_err(DeliveryError::into_handler_error)?;
        let km = self.km_for(&command).await?;
        self.store.assign(&msg.id(), &command, km, now_ms()).await?;
        Ok(())
    }
}
