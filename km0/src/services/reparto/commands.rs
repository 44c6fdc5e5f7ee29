//! The order saga's command to reparto: assign a courier to an order (`reparto.asignar` on
//! `reparto.comandos`), answered on `reparto.eventos` under the command's key:
//! `reparto.asignado` once a courier has it (at once, or when one frees up), or
//! `reparto.rechazado` for a city without couriers (the seed's exercise 3: the saga then
//! refunds and cancels). A repeated command gets the same answer again.

use std::sync::Arc;

use async_trait::async_trait;
use entrega::db::query;
use entrega::{ContractError, Event, Handler, Message, Router};
use entrega_core::{now_ms, Envelope, HandlerError, NewEvent, Processed, StoreError};

use crate::contracts::orders::StreetAddress;
use crate::contracts::{self, delivery};

use super::db::{covered_cities, state_of, take_courier, DeliveryState, DeliveryStore};
use super::domain::{blank, DeliveryError};
use super::maps::Maps;

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
                            DeliveryState::Cancelled => {
                                Some(refused_event(order, key, "entrega_cancelada")?)
                            }
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
            })
            .await
    }
}

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

#[async_trait]
impl Handler for CommandConsumer {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let command = AssignCommand::from_envelope(&msg.envelope)
            .map_err(DeliveryError::into_handler_error)?;
        let known = self.store.delivery(&command.order_id).await?.is_some();
        // The route is asked for only for a new delivery in a city served.
        let km = if !known && self.store.serves(&command.city).await? {
            let km = self
                .maps
                .route_km(&command.city, &command.street)
                .await
                .map_err(|e| {
                    if e.is_transient() {
                        HandlerError::transient(e)
                    } else {
                        HandlerError::permanent(e)
                    }
                })?;
            Some(km)
        } else {
            None
        };
        self.store.assign(&msg.id(), &command, km, now_ms()).await?;
        Ok(())
    }
}
