//! catalogo's consumer of inventario's events: `stock.actualizado` sets the flag, the
//! reservations' answers pass.

use std::sync::Arc;

use async_trait::async_trait;
use entrega::{Handler, Message, Router};
use entrega_core::HandlerError;

use super::db::CatalogStore;
use super::domain::{InvalidChange, StockChange};
use crate::services::inventario::{EVENTS_TOPIC, REFUSED, RELEASED, RESERVED, STOCK_UPDATED};

/// catalogo's consumer group.
pub const GROUP: &str = "catalogo";
/// The topic it reads (`inventario.eventos`).
pub const TOPIC: &str = EVENTS_TOPIC;

/// Keeps the catalogue's units and low-stock flags.
#[derive(Debug, Clone)]
pub struct CatalogConsumer {
    store: CatalogStore,
}

impl CatalogConsumer {
    /// A consumer writing to `store`.
    pub fn new(store: CatalogStore) -> Self {
        Self { store }
    }

    /// `stock.actualizado` to this consumer; the reservations' answers are ignored; anything
    /// else is dead-lettered.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new()
            .route(STOCK_UPDATED, handler)
            .ignore(RESERVED)
            .ignore(REFUSED)
            .ignore(RELEASED)
    }
}

#[async_trait]
impl Handler for CatalogConsumer {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let change =
            StockChange::from_envelope(&msg.envelope).map_err(InvalidChange::into_handler_error)?;
        self.store.apply(&change, msg.envelope.timestamp_ms).await?;
        Ok(())
    }
}
