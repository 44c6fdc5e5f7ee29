//! The stock consumer: `pedido.creado` from `pedidos.eventos`, applied once per `id_evento`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega::{Handler, Message, Router};
use entrega_core::{Envelope, HandlerError, Processed};

use super::db::{ApplyError, BatchItem, StockStore};
use super::domain::PlacedOrder;
use crate::contracts;
use crate::services::pedidos::{ORDER_CANCELLED, ORDER_CREATED, ORDER_PAID};

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
    pub async fn apply(&self, envelope: &Envelope) -> Result<Processed<()>, HandlerError> {
        let result = match PlacedOrder::from_envelope(envelope) {
            Ok(order) => {
                self.store
                    .apply(CONSUMER, &envelope.id.hyphenated().to_string(), &order)
                    .await
            }
            Err(e) => Err(e.into()),
        };
        self.stats.count(&result);
        result.map_err(into_handler_error)
    }

    /// Applies many events in one transaction (a savepoint each, each deduplicated by its own
    /// key). Returns one result per event attempted, in order; the list ends right after a
    /// transient failure, and the events left out were not applied. If the transaction
    /// fails to commit, nothing took effect: the first event gets the failure (so it counts
    /// as an attempt) and the rest are left out.
    pub async fn apply_batch(
        &self,
        envelopes: &[Envelope],
    ) -> Vec<Result<Processed<()>, HandlerError>> {
        let items: Vec<BatchItem> = envelopes.iter().map(|e| item(e, None)).collect();
        self.apply_items(&items).await
    }

    /// [`StockConsumer::apply_batch`] of delivered messages: the events each one's effect
    /// writes continue its trace.
    pub async fn apply_messages(
        &self,
        msgs: &[Message],
    ) -> Vec<Result<Processed<()>, HandlerError>> {
        let items: Vec<BatchItem> = msgs
            .iter()
            .map(|m| item(&m.envelope, Some(m.trace)))
            .collect();
        self.apply_items(&items).await
    }

    async fn apply_items(&self, items: &[BatchItem]) -> Vec<Result<Processed<()>, HandlerError>> {
        match self.store.apply_batch(CONSUMER, items).await {
            Ok(results) => results
                .into_iter()
                .map(|result| {
                    self.stats.count(&result);
                    result.map_err(into_handler_error)
                })
                .collect(),
            Err(e) if items.is_empty() => {
                tracing::warn!(error = %e, "empty stock batch failed to commit");
                Vec::new()
            }
            // Transient whatever the class: the failure belongs to the transaction, not to
            // the first event; exhausting the attempts still dead-letters a real culprit.
            Err(e) => vec![Err(HandlerError::transient(e))],
        }
    }

    /// The worker's router: `pedido.creado` to this consumer; the other order events are
    /// deliberately ignored (acknowledged without effect); anything else is dead-lettered.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new()
            .route(ORDER_CREATED, handler)
            .ignore(ORDER_PAID)
            .ignore(ORDER_CANCELLED)
    }
}

/// Whether `msg` is a copy of a `pedido.creado` published at two versions that inventario
/// leaves to the other copy (it shares their `id_evento`: no key is claimed for it).
fn other_copy(msg: &Message) -> bool {
    contracts::is_other_copy::<PlacedOrder>(&msg.headers, msg.envelope.version)
}

#[async_trait]
impl Handler for StockConsumer {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        if other_copy(msg) {
            return Ok(());
        }
        self.apply(&msg.envelope).await.map(drop)
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        if !msgs.iter().any(other_copy) {
            return self
                .apply_messages(msgs)
                .await
                .into_iter()
                .map(|r| r.map(drop))
                .collect();
        }
        let copies: Vec<bool> = msgs.iter().map(other_copy).collect();
        let kept: Vec<Message> = msgs
            .iter()
            .zip(&copies)
            .filter(|(_, copy)| !**copy)
            .map(|(m, _)| m.clone())
            .collect();
        let mut applied = self.apply_messages(&kept).await.into_iter();
        let mut results = Vec::with_capacity(msgs.len());
        for copy in copies {
            if copy {
                results.push(Ok(()));
                continue;
            }
            // The list of results ends where the batch stopped: so does this one.
            match applied.next() {
                Some(result) => results.push(result.map(drop)),
                None => break,
            }
        }
        results
    }
}

fn into_handler_error(e: ApplyError) -> HandlerError {
    match e {
        ApplyError::Stock(e) => e.into_handler_error(),
        ApplyError::Store(e) => HandlerError::from(e),
    }
}

fn item(envelope: &Envelope, trace: Option<entrega::TraceContext>) -> BatchItem {
    BatchItem {
        message_id: envelope.id.hyphenated().to_string(),
        order: PlacedOrder::from_envelope(envelope),
        trace,
    }
}
