//! Scenarios 1–3: inventario's consumer of `pedido.creado` killed at one point of its work,
//! on the embedded default (SQLite and the log transport in SQLite). Each side reads the same
//! orders with the same kills; only where it acknowledges and where it records the key
//! differ.
//!
//! A kill stops the consumer dead at that point: nothing after it runs, what it had not
//! committed is gone, and a new instance of the group resumes from the committed offset.

use std::collections::HashSet;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use entrega::db::{query, Db};
use entrega::{Broker, MigrationSet};
use entrega_core::{Envelope, OutgoingMessage, Record, Subscription};
use serde_json::json;

use super::embedded::{
    applied, event, listed, order_ids, picked, with_embedded, STOCK_MOVES, TOPIC,
};
use super::{Ledger, Side, SideRun};

/// Orders each side places.
const ORDERS: usize = 60;
/// Kills per side.
const KILLS: usize = 3;
const GROUP: &str = "lab.inventario";
const CONSUMER: &str = "lab.descuento_stock";
/// How long a side may take before what is left counts as stuck.
const WITHIN: Duration = Duration::from_secs(60);

/// Which mistake the naive side makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mistake {
    /// Scenario 1: the offset is committed before the effect; killed mid-effect.
    AckFirst,
    /// Scenario 2: acknowledged after the effect, with no key; killed between the database's
    /// commit and the acknowledgement.
    NoKey,
    /// Scenario 3: the key recorded in a transaction of its own; killed between the key and
    /// the effect.
    KeyApart,
}

impl Mistake {
    /// Where the kill lands, in words.
    fn kill_point(self) -> &'static str {
        match self {
            Self::AckFirst => "in the middle of the effect",
            Self::NoKey => "between the database's commit and the acknowledgement",
            Self::KeyApart => "between recording the key and applying the effect",
        }
    }
}

/// Runs one side of the scenario of `mistake` in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun, mistake: Mistake) -> anyhow::Result<Ledger> {
    let (dir, seed, side) = (r.dir.as_path(), r.seed, r.side);
    with_embedded(dir, "inventario", async |db, broker| {
        run_on(db, broker, seed, mistake, side).await
    })
    .await
}

async fn run_on(
    db: &Db,
    broker: &Broker,
    seed: u64,
    mistake: Mistake,
    side: Side,
) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Inbox]).await?;
    db.apply_migrations("lab", STOCK_MOVES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(ORDERS);
    let created: Vec<OutgoingMessage> = orders
        .iter()
        .map(|o| {
            let data = json!({"id": o, "lineas": [{"producto": "tomate-rosa", "cantidad": 1}]});
            event(TOPIC, "pedido.creado", o, data)
        })
        .collect();
    broker.publisher().publish(&created).await?;
    // The same orders are killed on both sides: those the seed picks.
    let doomed = picked(seed, &orders, KILLS);
    let kills = consume(db, broker, mistake, side, &doomed).await?;

    let mut ledger = Ledger::from_effects(&orders, &applied(db, "lab_stock_moves").await?);
    ledger.stuck = unread(broker).await?;
    ledger.fault = format!(
        "consumer killed {kills} times {} (orders {})",
        mistake.kill_point(),
        listed(&doomed)
    );
    Ok(ledger)
}

/// Records the group has not committed.
async fn unread(broker: &Broker) -> anyhow::Result<u64> {
    super::embedded::unread(broker, GROUP, TOPIC).await
}

/// Consumes until the group committed every record, killing the consumer the first time it
/// handles each doomed order; returns how many times it was killed.
async fn consume(
    db: &Db,
    broker: &Broker,
    mistake: Mistake,
    side: Side,
    doomed: &HashSet<String>,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + WITHIN;
    let mut killed: HashSet<String> = HashSet::new();
    let mut instance = 0;
    'instances: while Instant::now() < deadline {
        let member = format!("lab-{instance}");
        let mut sub = broker.subscriber().subscribe(GROUP, TOPIC, &member).await?;
        while Instant::now() < deadline {
            if unread(broker).await? == 0 {
                sub.close().await?;
                break 'instances;
            }
            for record in sub.poll(20, Duration::from_millis(100)).await? {
                let order = record.key.clone().unwrap_or_default();
                let kill = doomed.contains(&order) && killed.insert(order);
                let survived = handle(db, sub.as_mut(), &record, mistake, side, kill).await?;
                if !survived {
                    // Dead: the next instance starts from what was committed.
                    sub.close().await?;
                    instance += 1;
                    continue 'instances;
                }
            }
        }
        sub.close().await?;
    }
    Ok(killed.len())
}

/// Handles one record as `side` does; `false` when the consumer was killed on the way.
async fn handle(
    db: &Db,
    sub: &mut dyn Subscription,
    record: &Record,
    mistake: Mistake,
    side: Side,
    kill: bool,
) -> anyhow::Result<bool> {
    let envelope = Envelope::parse(&record.payload).context("the lab's own event")?;
    let key = envelope.id.to_string();
    let order = envelope.data["id"]
        .as_str()
        .context("the lab's own order id")?
        .to_owned();
    let ack = [(record.partition, record.offset + 1)];
    match (side, mistake) {
        (Side::Naive, Mistake::AckFirst) => {
            sub.commit(&ack).await?;
            if kill {
                return Ok(false);
            }
            take_stock(db, &order).await?;
        }
        (Side::Naive, Mistake::NoKey) => {
            take_stock(db, &order).await?;
            if kill {
                return Ok(false);
            }
            sub.commit(&ack).await?;
        }
        (Side::Naive, Mistake::KeyApart) => {
            let mut tx = db.begin().await?;
            let first = tx.claim(CONSUMER, &key).await?;
            tx.commit().await?;
            if kill {
                return Ok(false);
            }
            if first {
                take_stock(db, &order).await?;
            }
            sub.commit(&ack).await?;
        }
        (Side::Pattern, _) => {
            // The key and the effect in one transaction, acknowledged after its commit.
            let mut tx = db.begin().await?;
            let first = tx.claim(CONSUMER, &key).await?;
            if kill && mistake != Mistake::NoKey {
                // Killed inside the transaction: it never commits, key and effect alike.
                drop(tx);
                return Ok(false);
            }
            if first {
                tx.execute(
                    query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(&order),
                )
                .await?;
            }
            tx.commit().await?;
            if kill {
                return Ok(false);
            }
            sub.commit(&ack).await?;
        }
    }
    Ok(true)
}

/// Takes the stock of `order` in a transaction of its own.
async fn take_stock(db: &Db, order: &str) -> anyhow::Result<()> {
    let moved = db
        .execute(query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(order))
        .await?;
    if moved != 1 {
        bail!("the stock move of {order} was not written");
    }
    Ok(())
}
