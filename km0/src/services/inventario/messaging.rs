//! The stock consumer: `pedido.creado` from `pedidos.eventos`, applied once per `id_evento`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use entrega_core::{Envelope, HandlerError, Processed};

use super::db::{ApplyError, BatchItem, StockStore};
use super::domain::PlacedOrder;

/// The consumer's name in `mensajes_procesados.consumidor`, as in the seed.
pub const CONSUMER: &str = "inventario.descuento_stock";
/// Consumer group on the topic.
pub const GROUP: &str = "inventario";
/// The topic consumed.
pub const TOPIC: &str = crate::services::pedidos::TOPIC;

/// What the consumer has done since it started (for the demo report and operators).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    processed: AtomicU64,
    duplicates: AtomicU64,
    refused: AtomicU64,
}

/// A snapshot of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Events applied (stock taken, key recorded).
    pub processed: u64,
    /// Events recognised as already applied and skipped.
    pub duplicates: u64,
    /// Events refused for good (out of stock, unknown product, unreadable).
    pub refused: u64,
}

impl ConsumerStats {
    /// Current figures.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            processed: self.processed.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    fn count(&self, result: &Result<Processed<()>, ApplyError>) {
        let counter = match result {
            Ok(Processed::Applied(())) => &self.processed,
            Ok(Processed::Duplicate) => &self.duplicates,
            Err(e) if !e.is_transient() => &self.refused,
            Err(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Takes stock for each `pedido.creado`, exactly once per event id.
#[derive(Debug, Clone)]
pub struct StockConsumer {
    store: StockStore,
    stats: Arc<ConsumerStats>,
}

impl StockConsumer {
    /// A consumer over a migrated stock store.
    pub fn new(store: StockStore) -> Self {
        Self {
            store,
            stats: Arc::new(ConsumerStats::default()),
        }
    }

    /// The consumer's counters, shared with every clone.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        Arc::clone(&self.stats)
    }

    /// The stock store.
    pub fn store(&self) -> &StockStore {
        &self.store
    }

    /// Applies one `pedido.creado`: stock taken and key recorded in one transaction, or
    /// nothing. Out of stock, unknown products and unreadable payloads are permanent errors
    /// (dead letter); database failures are classified by the store.
    pub async fn handle(&self, envelope: &Envelope) -> Result<Processed<()>, HandlerError> {
        let result = match PlacedOrder::from_payload(&envelope.data) {
            Ok(order) => {
                self.store
                    .apply(CONSUMER, &envelope.id.to_string(), &order)
                    .await
            }
            Err(e) => Err(e.into()),
        };
        self.stats.count(&result);
        result.map_err(into_handler_error)
    }

    /// Applies many events in one transaction (a savepoint each). Returns one result per
    /// event attempted, in order; a transient failure ends the list early and the events
    /// left out were not applied. If the transaction itself fails to commit, every event
    /// gets that (classified) error.
    pub async fn handle_batch(
        &self,
        envelopes: &[Envelope],
    ) -> Vec<Result<Processed<()>, HandlerError>> {
        let items: Vec<BatchItem> = envelopes
            .iter()
            .map(|e| BatchItem {
                message_id: e.id.to_string(),
                order: PlacedOrder::from_payload(&e.data),
            })
            .collect();
        match self.store.apply_batch(CONSUMER, &items).await {
            Ok(results) => results
                .into_iter()
                .map(|result| {
                    self.stats.count(&result);
                    result.map_err(into_handler_error)
                })
                .collect(),
            Err(e) => {
                // Nothing committed: report the failure for the whole batch, so no offset
                // moves past an event that did not take effect.
                let transient = e.is_transient();
                let reason = e.to_string();
                envelopes
                    .iter()
                    .map(|_| {
                        Err(if transient {
                            HandlerError::transient(reason.clone())
                        } else {
                            HandlerError::permanent(reason.clone())
                        })
                    })
                    .collect()
            }
        }
    }
}

fn into_handler_error(e: ApplyError) -> HandlerError {
    match e {
        ApplyError::Stock(e) => HandlerError::permanent(e),
        ApplyError::Store(e) => HandlerError::from(e),
    }
}
