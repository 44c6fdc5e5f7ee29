//! The delivery consumer: `pedido.pagado` assigns a courier (or leaves the delivery pending),
//! `pedido.cancelado` cancels it; each event applied once per `id_evento`.
//!
//! Its failures are the seed's exercise 3: the maps service answering 503 or the database
//! restarting are transient (retried with backoff), a city without couriers and an event of
//! the wrong schema are permanent (dead letter at once, `motivo` `ciudad_no_cubierta: ...` or
//! `esquema: ...`), and no free courier is not a failure at all (persisted as pending).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega::{Handler, Message, Router};
use entrega_core::{now_ms, HandlerError, Processed};

use super::db::{DeliveryState, DeliveryStore};
use super::domain::{cancelled_order_id, DeliveryError, PaidOrder};
use super::maps::{Maps, MapsError};
use crate::services::pedidos::{ORDER_CANCELLED, ORDER_CREATED, ORDER_PAID};

/// The consumer's name in `mensajes_procesados.consumidor`.
pub const CONSUMER: &str = "reparto.asignacion";
/// Consumer group on the topic.
pub const GROUP: &str = "reparto";
/// The topic consumed.
pub const TOPIC: &str = crate::services::pedidos::TOPIC;

/// What the consumer has done since it started.
#[derive(Debug, Default)]
pub struct DeliveryStats {
    /// Deliveries given a courier at once.
    pub assigned: AtomicU64,
    /// Deliveries left pending (no free courier).
    pub pending: AtomicU64,
    /// Cancellations applied.
    pub cancelled: AtomicU64,
    /// Events already applied, skipped.
    pub duplicates: AtomicU64,
}

/// Assigns couriers to paid orders; see the module docs.
pub struct DeliveryConsumer {
    store: DeliveryStore,
    maps: Arc<dyn Maps>,
    stats: Arc<DeliveryStats>,
}

impl std::fmt::Debug for DeliveryConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryConsumer")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl DeliveryConsumer {
    /// A consumer over a migrated store, asking `maps` for routes.
    pub fn new(store: DeliveryStore, maps: Arc<dyn Maps>) -> Self {
        Self {
            store,
            maps,
            stats: Arc::default(),
        }
    }

    /// The consumer's counters.
    pub fn stats(&self) -> Arc<DeliveryStats> {
        Arc::clone(&self.stats)
    }

    /// The worker's router: payments and cancellations here, new orders ignored.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new()
            .route(ORDER_PAID, handler.clone())
            .route(ORDER_CANCELLED, handler)
            .ignore(ORDER_CREATED)
    }

    async fn paid(&self, msg: &Message) -> Result<(), HandlerError> {
        let order =
            PaidOrder::from_envelope(&msg.envelope).map_err(DeliveryError::into_handler_error)?;
        let id = msg.id();
        // A redelivered event does not ask the maps service again.
        if self.store.is_processed(CONSUMER, &id).await? {
            bump(&self.stats.duplicates);
            return Ok(());
        }
        if !self.store.serves(&order.city).await? {
            let refused = DeliveryError::CityNotServed {
                city: order.city.clone(),
                covered: self.store.cities().await?,
            };
            return Err(HandlerError::permanent(refused));
        }
        let km = self
            .maps
            .route_km(&order.city, &order.street)
            .await
            .map_err(MapsError::into_handler_error)?;
        match self
            .store
            .apply_paid(CONSUMER, &id, &order, km, now_ms())
            .await?
        {
            Processed::Duplicate => bump(&self.stats.duplicates),
            Processed::Applied(DeliveryState::Assigned) => bump(&self.stats.assigned),
            Processed::Applied(DeliveryState::Pending) => bump(&self.stats.pending),
            Processed::Applied(_) => {}
        }
        Ok(())
    }

    async fn cancelled(&self, msg: &Message) -> Result<(), HandlerError> {
        let order_id =
            cancelled_order_id(&msg.envelope).map_err(DeliveryError::into_handler_error)?;
        match self
            .store
            .apply_cancelled(CONSUMER, &msg.id(), &order_id, now_ms())
            .await?
        {
            Processed::Applied(()) => bump(&self.stats.cancelled),
            Processed::Duplicate => bump(&self.stats.duplicates),
        }
        Ok(())
    }
}

#[async_trait]
impl Handler for DeliveryConsumer {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        if msg.kind() == ORDER_CANCELLED {
            self.cancelled(msg).await
        } else {
            self.paid(msg).await
        }
    }
}
