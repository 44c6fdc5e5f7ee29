//! Scenarios 4 and 5: pedidos storing an order and telling the others about it, on the
//! embedded default. The naive side writes to its database and to the broker separately (the
//! dual write); the pattern writes the event into the outbox in the order's transaction and
//! lets the relay publish it.
//!
//! The ledger reads the orders stored and the `pedido.creado` records on the topic: an order
//! stored with no event is lost, an event of an order never stored is a ghost.

use std::collections::HashSet;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use entrega::db::{query, Db, Migration};
use entrega::{
    Broker, CancellationToken, MigrationSet, NewEvent, Relay, RelayConfig, SystemClock,
    TopicRouting,
};
use entrega_core::{now_ms, Envelope};
use serde_json::json;

use super::embedded::{event, listed, order_ids, picked, with_embedded, TOPIC};
use super::{Ledger, Side, SideRun};

/// Orders the workload places.
const ORDERS: usize = 60;
/// Orders the fault hits.
const HIT: usize = 3;
/// How long the relay may take to drain before what is left counts as stuck.
const WITHIN: Duration = Duration::from_secs(30);

/// An order and its lines; a line of no units breaks its `CHECK`, late in the transaction.
const TABLES: &[Migration] = &[Migration::same(
    1,
    "the lab's orders",
    "CREATE TABLE IF NOT EXISTS lab_orders (id TEXT PRIMARY KEY);
     CREATE TABLE IF NOT EXISTS lab_order_lines (
         order_id TEXT NOT NULL,
         product  TEXT NOT NULL,
         units    INTEGER NOT NULL CHECK (units > 0)
     );",
)];

/// Which fault hits the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// Scenario 4: the process dies right after the order's commit.
    CrashAfterCommit,
    /// Scenario 5: the order's transaction fails after the event left (a line breaks its
    /// check) and rolls back.
    RollbackAfterPublish,
}

/// Runs one side of the scenario of `fault` in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun, fault: Fault) -> anyhow::Result<Ledger> {
    let (dir, seed, side) = (r.dir.as_path(), r.seed, r.side);
    with_embedded(dir, "pedidos", async |db, broker| {
        run_on(db, broker, seed, fault, side).await
    })
    .await
}

async fn run_on(
    db: &Db,
    broker: &Broker,
    seed: u64,
    fault: Fault,
    side: Side,
) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Outbox]).await?;
    db.apply_migrations("lab", TABLES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(ORDERS);
    let hit = picked(seed, &orders, HIT);
    for order in &orders {
        let hit = hit.contains(order);
        match side {
            Side::Naive => write_naive(db, broker, order, fault, hit).await?,
            Side::Pattern => write_with_outbox(db, order, fault, hit).await?,
        }
    }
    let stuck = match side {
        Side::Naive => 0,
        Side::Pattern => relay_all(db, broker).await?,
    };
    let stored = stored_orders(db).await?;
    let published = published_orders(broker).await?;
    let stored_set: HashSet<&String> = stored.iter().collect();
    let ghosts = published.iter().filter(|o| !stored_set.contains(o)).count() as u64;
    let mut ledger = Ledger::from_effects(&stored, &published);
    // An event of an order never stored is neither lost nor a repeat: a ghost.
    ledger.ghosts = ghosts;
    ledger.stuck = stuck;
    ledger.fault = match fault {
        Fault::CrashAfterCommit => format!(
            "writer killed {HIT} times right after an order's commit (orders {})",
            listed(&hit)
        ),
        Fault::RollbackAfterPublish => format!(
            "{HIT} orders' transactions rolled back by a line breaking its check (orders {})",
            listed(&hit)
        ),
    };
    Ok(ledger)
}

/// The lines of `order`: one of no units when `broken`, which the table refuses.
fn lines(broken: bool) -> [(&'static str, i64); 2] {
    [
        ("tomate-rosa", 2),
        ("queso-curado", if broken { 0 } else { 1 }),
    ]
}

async fn insert_order(tx: &mut entrega::db::Tx, order: &str) -> Result<(), entrega::StoreError> {
    tx.execute(query("INSERT INTO lab_orders (id) VALUES ($1)").bind(order))
        .await?;
    Ok(())
}

async fn insert_lines(
    tx: &mut entrega::db::Tx,
    order: &str,
    broken: bool,
) -> Result<(), entrega::StoreError> {
    for (product, units) in lines(broken) {
        tx.execute(
            query("INSERT INTO lab_order_lines (order_id, product, units) VALUES ($1, $2, $3)")
                .bind(order)
                .bind(product)
                .bind(units),
        )
        .await?;
    }
    Ok(())
}

fn outbox_event(order: &str) -> NewEvent {
    NewEvent::new("pedido", order, "pedido.creado", json!({"id": order}))
}

/// The naive writer: the database, then the broker, as two writes. When `hit`, the fault
/// lands between them.
async fn write_naive(
    db: &Db,
    broker: &Broker,
    order: &str,
    fault: Fault,
    hit: bool,
) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    insert_order(&mut tx, order).await?;
    match fault {
        Fault::CrashAfterCommit => {
            insert_lines(&mut tx, order, false).await?;
            tx.commit().await?;
            if hit {
                // Killed here: the publish below never runs.
                return Ok(());
            }
            publish(broker, order).await
        }
        Fault::RollbackAfterPublish => {
            // Published inside the transaction, before it is known to commit.
            publish(broker, order).await?;
            match insert_lines(&mut tx, order, hit).await {
                Ok(()) => Ok(tx.commit().await?),
                Err(_) if hit => {
                    drop(tx);
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

async fn publish(broker: &Broker, order: &str) -> anyhow::Result<()> {
    let message = event(TOPIC, "pedido.creado", order, json!({"id": order}));
    broker.publisher().publish(&[message]).await?;
    Ok(())
}

/// The pattern's writer: the order and its event in one transaction (the outbox). The same
/// faults: killed right after the commit, or the transaction failing on a line.
async fn write_with_outbox(db: &Db, order: &str, fault: Fault, hit: bool) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    insert_order(&mut tx, order).await?;
    tx.enqueue(&outbox_event(order)).await?;
    let broken = hit && fault == Fault::RollbackAfterPublish;
    match insert_lines(&mut tx, order, broken).await {
        Ok(()) => tx.commit().await?,
        Err(_) if broken => drop(tx),
        Err(e) => return Err(e.into()),
    }
    // Killed right after the commit (when hit): the writer has nothing left to do; the
    // relay publishes what committed.
    Ok(())
}

/// Runs the relay until the outbox is drained; returns the rows still pending after
/// [`WITHIN`].
async fn relay_all(db: &Db, broker: &Broker) -> anyhow::Result<u64> {
    let relay = RunningRelay::start(db, broker.publisher());
    relay.drain(db).await
}

/// entrega's relay of the lab's outbox, running in the background.
pub(super) struct RunningRelay {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), entrega::RelayError>>,
}

impl RunningRelay {
    /// Starts relaying `db`'s outbox to [`TOPIC`] through `publisher`.
    pub(super) fn start(db: &Db, publisher: Arc<dyn entrega_core::Publisher>) -> Self {
        let relay = Relay::new(
            db.outbox(),
            publisher,
            Arc::new(SystemClock),
            RelayConfig::new("pedidos", TopicRouting::new().route("pedido", TOPIC)),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { relay.run(stop).await }
        });
        Self { stop, task }
    }

    /// Waits until the outbox is drained (for [`WITHIN`] at most), then stops the relay;
    /// returns the rows still pending.
    pub(super) async fn drain(self, db: &Db) -> anyhow::Result<u64> {
        let deadline = Instant::now() + WITHIN;
        let pending = loop {
            let pending = db.outbox().maintenance.status(now_ms()).await?.pending;
            if pending == 0 || Instant::now() >= deadline || self.task.is_finished() {
                break pending;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.stop.cancel();
        self.task.await.context("the lab's relay")??;
        Ok(pending)
    }
}

/// The orders stored in `lab_orders`, by id.
pub(super) async fn stored_orders(db: &Db) -> anyhow::Result<Vec<String>> {
    Ok(db
        .fetch_all(query("SELECT id FROM lab_orders ORDER BY id"))
        .await?
        .into_iter()
        .map(|(id,): (String,)| id)
        .collect())
}

/// The order of every `pedido.creado` on the topic, in log order.
pub(super) async fn published_orders(broker: &Broker) -> anyhow::Result<Vec<String>> {
    let mut orders = Vec::new();
    for (partition, end) in broker.end_offsets(TOPIC).await? {
        let mut from = 0;
        while from < end {
            let records = broker.read(TOPIC, partition, from, 500).await?;
            let Some(last) = records.last() else { break };
            from = last.offset + 1;
            for record in records {
                let envelope = Envelope::parse(&record.payload)?;
                match envelope.data["id"].as_str() {
                    Some(id) => orders.push(id.to_owned()),
                    None => bail!("a pedido.creado without its order id"),
                }
            }
        }
    }
    Ok(orders)
}
