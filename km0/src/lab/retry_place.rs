//! Scenario: a message that fails for a while (its effect's dependency times out) on a
//! partition, on the embedded default. Both sides try it again on the same schedule (200 ms,
//! doubling) until it succeeds, at its fifth try. The naive consumer retries in place: the
//! partition waits for the whole schedule and every healthy message behind it waits too. The
//! pattern (entrega's worker with the seed's retry topic) writes the failing message to
//! `pedidos.eventos.retry` with its attempts and its earliest next try, and the partition goes
//! on; the retry topic tries it again when its time comes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::{query, Db};
use entrega::{
    Backoff, Broker, CancellationToken, Handler, HandlerError, Message, MigrationSet,
    RetryStrategy, Router, Worker, WorkerConfig,
};
use entrega_core::{Envelope, OutgoingMessage};
use serde_json::json;

use super::embedded::{
    applied, event, listed, order_ids, picked, with_embedded, STOCK_MOVES, TOPIC,
};
use super::{Ledger, Side, SideRun};

/// Messages on the partition.
const MESSAGES: usize = 40;
/// Of which fail for a while.
const FLAKY: usize = 2;
/// Tries that fail before one succeeds.
const FAILS: u32 = 4;
/// The first wait before a retry; it doubles each time.
const FIRST_WAIT: Duration = Duration::from_millis(200);
const GROUP: &str = "lab.inventario";
/// How long a side may take before what is left counts as stuck.
const WITHIN: Duration = Duration::from_secs(30);

/// Runs one side in its directory.
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let (seed, side) = (r.seed, r.side);
    with_embedded(&r.dir, "inventario", async |db, broker| {
        run_on(db, broker, seed, side).await
    })
    .await
}

/// The effect, failing the flaky orders' first tries; it notes when each order was applied.
struct TakeStock {
    db: Db,
    flaky: HashSet<String>,
    tries: Mutex<HashMap<String, u32>>,
    applied_at: Mutex<HashMap<String, Instant>>,
}

impl TakeStock {
    async fn apply(&self, payload: &[u8]) -> Result<(), HandlerError> {
        let envelope = Envelope::parse(payload).map_err(HandlerError::permanent)?;
        let order = envelope.data["id"].as_str().unwrap_or_default().to_owned();
        if self.flaky.contains(&order) {
            let mut tries = self.tries.lock().unwrap_or_else(|e| e.into_inner());
            let n = tries.entry(order.clone()).or_insert(0);
            *n += 1;
            if *n <= FAILS {
                return Err(HandlerError::transient(format!(
                    "the stock service timed out (try {n})"
                )));
            }
        }
        let mut tx = self.db.begin().await.map_err(HandlerError::transient)?;
        if tx
            .claim("lab.descuento_stock", &envelope.id.to_string())
            .await
            .map_err(HandlerError::transient)?
        {
            tx.execute(query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(&order))
                .await
                .map_err(HandlerError::transient)?;
        }
        tx.commit().await.map_err(HandlerError::transient)?;
        self.applied_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(order)
            .or_insert_with(Instant::now);
        Ok(())
    }
}

#[async_trait]
impl Handler for TakeStock {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        self.apply(&msg.envelope.to_bytes()).await
    }
}

async fn run_on(db: &Db, broker: &Broker, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Inbox]).await?;
    db.apply_migrations("lab", STOCK_MOVES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(MESSAGES);
    let flaky = picked(seed, &orders, FLAKY);
    let effect = Arc::new(TakeStock {
        db: db.clone(),
        flaky: flaky.clone(),
        tries: Mutex::new(HashMap::new()),
        applied_at: Mutex::new(HashMap::new()),
    });
    let messages: Vec<OutgoingMessage> = orders
        .iter()
        .map(|o| event(TOPIC, "pedido.creado", o, json!({"id": o})))
        .collect();
    let published = Instant::now();
    broker.publisher().publish(&messages).await?;
    match side {
        Side::Naive => retry_in_place(&effect, broker, MESSAGES).await?,
        Side::Pattern => with_retry_topic(&effect, broker, MESSAGES).await?,
    }

    let mut ledger = Ledger::from_effects(&orders, &applied(db, "lab_stock_moves").await?);
    ledger.stuck = ledger.lost;
    ledger.lost = 0;
    let at = effect
        .applied_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // A healthy order held up: behind a flaky one on the partition, and applied only once
    // that one finally was.
    let held_up: Vec<&String> = orders
        .iter()
        .enumerate()
        .filter(|(i, o)| {
            !flaky.contains(*o)
                && orders[..*i].iter().filter(|f| flaky.contains(*f)).any(|f| {
                    matches!((at.get(*o), at.get(f)), (Some(mine), Some(theirs)) if mine >= theirs)
                })
        })
        .map(|(_, o)| o)
        .collect();
    ledger.held_up = held_up.len() as u64;
    let waits: Vec<u128> = orders
        .iter()
        .filter(|o| !flaky.contains(*o))
        .filter_map(|o| at.get(o).map(|t| t.duration_since(published).as_millis()))
        .collect();
    ledger.fault = format!(
        "orders {} fail {FAILS} tries each (a timeout), retried after {} ms doubling; healthy \
         orders applied within {} ms of publishing at the latest",
        listed(&flaky),
        FIRST_WAIT.as_millis(),
        waits.iter().max().copied().unwrap_or(0)
    );
    Ok(ledger)
}

/// The naive consumer: a record that fails is tried again, in place, after a wait that
/// doubles; the records behind it wait.
async fn retry_in_place(effect: &TakeStock, broker: &Broker, total: usize) -> anyhow::Result<()> {
    let mut sub = broker.subscriber().subscribe(GROUP, TOPIC, "lab-0").await?;
    let until = Instant::now() + WITHIN;
    let mut wait = FIRST_WAIT;
    let mut done = 0;
    'run: while Instant::now() < until && done < total {
        for record in sub.poll(20, Duration::from_millis(100)).await? {
            if effect.apply(&record.payload).await.is_err() {
                // Read it again after the wait; nothing behind it moves meanwhile.
                sub.seek(record.partition, record.offset);
                tokio::time::sleep(wait).await;
                wait *= 2;
                continue 'run;
            }
            wait = FIRST_WAIT;
            done += 1;
            sub.commit(&[(record.partition, record.offset + 1)]).await?;
        }
    }
    sub.close().await?;
    Ok(())
}

/// entrega's worker with the retry topic: a failing record leaves the partition for
/// `<topic>.retry` and comes back when its wait is over.
async fn with_retry_topic(
    effect: &Arc<TakeStock>,
    broker: &Broker,
    total: usize,
) -> anyhow::Result<()> {
    let router = Router::new().route("pedido.creado", effect.clone());
    let mut config = WorkerConfig::new(GROUP, TOPIC).with_retry(RetryStrategy::RetryTopic);
    config.max_attempts = FAILS + 2;
    config.backoff = Backoff::new(FIRST_WAIT, Duration::from_secs(10)).with_jitter(0.0);
    config.poll_wait = Duration::from_millis(50);
    let worker = Worker::new(broker.subscriber(), broker.publisher(), router, config)
        .with_admin(broker.admin());
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    let until = Instant::now() + WITHIN;
    while Instant::now() < until && !task.is_finished() {
        let applied = effect
            .applied_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        if applied >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await??;
    Ok(())
}
