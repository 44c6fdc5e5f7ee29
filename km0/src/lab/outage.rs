//! Scenario 8: the broker down for a while as customers place orders, on the embedded default.
//! The naive pedidos publishes `pedido.creado` from the request path, after storing the
//! order; the pattern writes it into the outbox and answers at once, and the relay drains it
//! when the broker is back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{query, Db};
use entrega::{Broker, MigrationSet, NewEvent};
use entrega_core::{OutgoingMessage, Publisher, TransportError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::dual_write::{published_orders, stored_orders, RunningRelay};
use super::embedded::{event, order_ids, with_embedded, TOPIC};
use super::{Ledger, Side, SideRun};

/// Orders the customers place.
const ORDERS: usize = 60;
/// Orders placed while the broker is down.
const DOWN_FOR: usize = 12;

/// A broker that is down while `down` is set.
struct Outage {
    inner: Arc<dyn Publisher>,
    down: AtomicBool,
    refused: AtomicUsize,
}

#[async_trait]
impl Publisher for Outage {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(TransportError::unavailable("the lab's broker is down"));
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
    db.execute(query(
        "CREATE TABLE IF NOT EXISTS lab_orders (id TEXT PRIMARY KEY)",
    ))
    .await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(ORDERS);
    let first_down = StdRng::seed_from_u64(seed).gen_range(0..ORDERS - DOWN_FOR);
    let outage = Arc::new(Outage {
        inner: broker.publisher(),
        down: AtomicBool::new(false),
        refused: AtomicUsize::new(0),
    });
    let relay = match side {
        Side::Pattern => Some(RunningRelay::start(db, outage.clone())),
        Side::Naive => None,
    };
    let mut failed_requests = 0;
    for (i, order) in orders.iter().enumerate() {
        outage.down.store(
            (first_down..first_down + DOWN_FOR).contains(&i),
            Ordering::SeqCst,
        );
        let answered = match side {
            Side::Naive => place_and_publish(db, outage.as_ref(), order).await?,
            Side::Pattern => place_with_outbox(db, order).await?,
        };
        failed_requests += usize::from(!answered);
        // Customers keep coming at their pace; the relay keeps trying meanwhile.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    outage.down.store(false, Ordering::SeqCst);
    let stuck = match relay {
        Some(relay) => relay.drain(db).await?,
        None => 0,
    };
    let placed = stored_orders(db).await?;
    let published = published_orders(broker).await?;
    let mut ledger = Ledger::from_effects(&placed, &published);
    ledger.stuck = stuck;
    ledger.fault = format!(
        "broker down while {DOWN_FOR} orders were placed ({} to {}): {} publishes refused, \
         {failed_requests} requests answered with an error",
        orders.get(first_down).map_or("", String::as_str),
        orders
            .get(first_down + DOWN_FOR - 1)
            .map_or("", String::as_str),
        outage.refused.load(Ordering::SeqCst),
    );
    Ok(ledger)
}

/// The naive request path: store the order, then publish its event; `false` when the
/// customer got an error (the broker refused), though the order stays stored.
async fn place_and_publish(db: &Db, broker: &dyn Publisher, order: &str) -> anyhow::Result<bool> {
    db.execute(query("INSERT INTO lab_orders (id) VALUES ($1)").bind(order))
        .await?;
    let message = event(TOPIC, "pedido.creado", order, json!({"id": order}));
    Ok(broker.publish(&[message]).await.is_ok())
}

/// The pattern's request path: the order and its event in one transaction; the broker is
/// not on the path.
async fn place_with_outbox(db: &Db, order: &str) -> anyhow::Result<bool> {
    let mut tx = db.begin().await?;
    tx.execute(query("INSERT INTO lab_orders (id) VALUES ($1)").bind(order))
        .await?;
    tx.enqueue(&NewEvent::new(
        "pedido",
        order,
        "pedido.creado",
        json!({"id": order}),
    ))
    .await?;
    tx.commit().await?;
    Ok(true)
}
