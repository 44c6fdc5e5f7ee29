//! Scenario 6: a relay whose broker refuses some batches, on the embedded default. The naive
//! relay marks its rows published and then publishes them; the pattern (entrega's relay)
//! publishes, waits for the broker's confirmation, and only then marks.
//!
//! The broker refuses the first batch that carries each of the seed's chosen orders (as a
//! broker away for a moment would); every later try is accepted. The naive relay loses every
//! order of a refused batch, not only the chosen ones.

use std::collections::HashSet;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::{query, Db};
use entrega::{
    Broker, CancellationToken, MigrationSet, NewEvent, Relay, RelayConfig, SystemClock,
    TopicRouting,
};
use entrega_core::{now_ms, OutgoingMessage, Publisher, TransportError};
use serde_json::json;

use super::dual_write::published_orders;
use super::embedded::{event, listed, order_ids, picked, with_embedded, TOPIC};
use super::{Ledger, Side, SideRun};

/// Orders in the outbox.
const ORDERS: usize = 60;
/// Orders whose first batch the broker refuses.
const REFUSED: usize = 3;
/// Rows per batch, as a relay reads them.
const BATCH: i64 = 10;
/// How long a relay may take before what is left counts as stuck.
const WITHIN: Duration = Duration::from_secs(30);

/// A broker that refuses, once, each batch carrying one of `doomed`.
struct Refusing {
    inner: Arc<dyn Publisher>,
    doomed: HashSet<String>,
    refused: Mutex<HashSet<String>>,
    /// Publishes refused.
    refusals: AtomicUsize,
}

#[async_trait]
impl Publisher for Refusing {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let newly: Vec<String> = {
            let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
            batch
                .iter()
                .filter_map(|m| m.key.clone())
                .filter(|k| self.doomed.contains(k) && refused.insert(k.clone()))
                .collect()
        };
        if !newly.is_empty() {
            self.refusals.fetch_add(1, Ordering::SeqCst);
            return Err(TransportError::unavailable(format!(
                "the lab's broker refuses the batch with {}",
                newly.join(", ")
            )));
        }
        self.inner.publish(batch).await
    }
}

/// Runs one side in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let (dir, seed, side) = (r.dir.as_path(), r.seed, r.side);
    with_embedded(dir, "pedidos", async |db, broker| {
        run_on(db, broker, seed, side).await
    })
    .await
}

async fn run_on(db: &Db, broker: &Broker, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Outbox]).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(ORDERS);
    let mut tx = db.begin().await?;
    for order in &orders {
        tx.enqueue(&NewEvent::new(
            "pedido",
            order,
            "pedido.creado",
            json!({"id": order}),
        ))
        .await?;
    }
    tx.commit().await?;
    let doomed = picked(seed, &orders, REFUSED);
    let refusing = Arc::new(Refusing {
        inner: broker.publisher(),
        doomed: doomed.clone(),
        refused: Mutex::default(),
        refusals: AtomicUsize::new(0),
    });
    match side {
        Side::Naive => relay_marking_first(db, refusing.as_ref()).await?,
        Side::Pattern => relay_with_entrega(db, refusing.clone()).await?,
    }
    let published = published_orders(broker).await?;
    let mut ledger = Ledger::from_effects(&orders, &published);
    ledger.stuck = db.outbox().maintenance.status(now_ms()).await?.pending;
    let refusals = refusing.refusals.load(Ordering::SeqCst);
    ledger.fault = format!(
        "broker refused {refusals} publish{}: the first batch carrying each of {}",
        if refusals == 1 { "" } else { "es" },
        listed(&doomed)
    );
    Ok(ledger)
}

/// The naive relay: each round marks a batch published, then publishes it; a refused
/// publish is logged and the relay goes on.
async fn relay_marking_first(db: &Db, publisher: &dyn Publisher) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    while Instant::now() < deadline {
        let mut tx = db.begin().await?;
        let rows: Vec<(String, String)> = tx
            .fetch_all(
                query(
                    "SELECT id, agregado_id FROM outbox WHERE publicado_en IS NULL \
                     ORDER BY rowid LIMIT $1",
                )
                .bind(BATCH),
            )
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        for (id, _) in &rows {
            tx.execute(
                query("UPDATE outbox SET publicado_en = CURRENT_TIMESTAMP WHERE id = $1").bind(id),
            )
            .await?;
        }
        tx.commit().await?;
        let batch: Vec<OutgoingMessage> = rows
            .iter()
            .map(|(_, order)| event(TOPIC, "pedido.creado", order, json!({"id": order})))
            .collect();
        if let Err(e) = publisher.publish(&batch).await {
            tracing::debug!(error = %e, "the naive relay's publish failed; its rows are marked");
        }
    }
    Ok(())
}

/// entrega's relay: publish, wait for the confirmation, then mark; a refused batch stays
/// pending and goes again after the backoff.
async fn relay_with_entrega(db: &Db, publisher: Arc<dyn Publisher>) -> anyhow::Result<()> {
    let mut config = RelayConfig::new("pedidos", TopicRouting::new().route("pedido", TOPIC));
    config.batch_size = usize::try_from(BATCH)?;
    let relay = Relay::new(db.outbox(), publisher, Arc::new(SystemClock), config);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let deadline = Instant::now() + WITHIN;
    while Instant::now() < deadline && !task.is_finished() {
        if db.outbox().maintenance.status(now_ms()).await?.pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await??;
    Ok(())
}
