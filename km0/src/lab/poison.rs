//! Scenario 10: poison messages on a partition, on the embedded default. Two records of the
//! seed's choosing are malformed JSON (a permanent failure: no wait will fix them). The naive
//! consumer retries whatever fails, in place, with a growing pause, as at-least-once "and
//! nothing more" does; the pattern (entrega's worker) classifies the failure and sends a
//! permanent one to `<topic>.dlq` at once, with its reason, and the partition goes on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::{query, Db};
use entrega::{
    Broker, CancellationToken, Handler, HandlerError, Message, MigrationSet, Router, Worker,
    WorkerConfig,
};
use entrega_core::{Envelope, OutgoingMessage};
use serde_json::json;

use super::embedded::{
    applied, listed, order_ids, picked, wire, with_embedded, STOCK_MOVES, TOPIC,
};
use super::{Ledger, Side, SideRun};

/// Messages on the partition.
const MESSAGES: usize = 40;
/// Of which poison.
const POISON: usize = 2;
const DLQ: &str = "pedidos.eventos.dlq";
const GROUP: &str = "lab.inventario";
/// How long each side may run; what is not applied by then is stuck.
const RUN_FOR: Duration = Duration::from_secs(3);
/// The naive consumer's first pause before retrying; it doubles each time, up to a second.
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// Runs one side in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let (dir, seed, side) = (r.dir.as_path(), r.seed, r.side);
    with_embedded(dir, "inventario", async |db, broker| {
        run_on(db, broker, seed, side).await
    })
    .await
}

fn message(order: &str, poison: bool) -> OutgoingMessage {
    let envelope = Envelope::new("pedido.creado", "pedidos", json!({"id": order}));
    let mut payload = envelope.to_bytes();
    if poison {
        // Cut short: not JSON at all.
        payload.truncate(payload.len() / 2);
    }
    wire(TOPIC, order, &envelope, payload)
}

async fn run_on(db: &Db, broker: &Broker, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Inbox]).await?;
    db.apply_migrations("lab", STOCK_MOVES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    broker.admin().ensure_topic(DLQ, 1).await?;
    let orders = order_ids(MESSAGES);
    let poison = picked(seed, &orders, POISON);
    let messages: Vec<OutgoingMessage> = orders
        .iter()
        .map(|o| message(o, poison.contains(o)))
        .collect();
    broker.publisher().publish(&messages).await?;
    let healthy: Vec<String> = orders
        .iter()
        .filter(|o| !poison.contains(*o))
        .cloned()
        .collect();
    let tries = match side {
        Side::Naive => retry_in_place(db, broker, healthy.len()).await?,
        Side::Pattern => with_the_worker(db, broker, healthy.len()).await?,
    };
    let mut ledger = Ledger::from_effects(&healthy, &applied(db, "lab_stock_moves").await?);
    // Healthy orders not applied by the end were waiting behind a poison message.
    ledger.stuck = ledger.lost;
    ledger.lost = 0;
    let dead: i64 = broker.end_offsets(DLQ).await?.iter().map(|(_, e)| e).sum();
    ledger.fault = format!(
        "{POISON} malformed messages ({}): {tries} failed tries, {dead} dead-lettered, in {} s",
        listed(&poison),
        RUN_FOR.as_secs()
    );
    Ok(ledger)
}

/// Takes the stock of the order in `payload`, once per message.
async fn take_stock(db: &Db, payload: &[u8]) -> Result<(), String> {
    let envelope = Envelope::parse(payload).map_err(|e| e.to_string())?;
    let order = envelope.data["id"].as_str().unwrap_or_default().to_owned();
    let mut tx = db.begin().await.map_err(|e| e.to_string())?;
    if tx
        .claim("lab.descuento_stock", &envelope.id.to_string())
        .await
        .map_err(|e| e.to_string())?
    {
        tx.execute(query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(&order))
            .await
            .map_err(|e| e.to_string())?;
    }
    tx.commit().await.map_err(|e| e.to_string())
}

/// The naive consumer: a record that fails is tried again, in place, after a pause that
/// doubles; the records behind it wait. Returns the failed tries.
async fn retry_in_place(db: &Db, broker: &Broker, healthy: usize) -> anyhow::Result<u64> {
    let mut sub = broker.subscriber().subscribe(GROUP, TOPIC, "lab-0").await?;
    let until = Instant::now() + RUN_FOR;
    let mut failures = 0u64;
    let mut pause = FIRST_PAUSE;
    let mut applied = 0;
    'run: while Instant::now() < until && applied < healthy {
        for record in sub.poll(20, Duration::from_millis(100)).await? {
            if take_stock(db, &record.payload).await.is_err() {
                failures += 1;
                // Read it again after the pause; nothing behind it moves meanwhile.
                sub.seek(record.partition, record.offset);
                tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now())))
                    .await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue 'run;
            }
            applied += 1;
            sub.commit(&[(record.partition, record.offset + 1)]).await?;
        }
    }
    sub.close().await?;
    Ok(failures)
}

struct TakeStock {
    db: Db,
}

#[async_trait]
impl Handler for TakeStock {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let order = msg.envelope.data["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut tx = self.db.begin().await.map_err(HandlerError::transient)?;
        if tx
            .claim("lab.descuento_stock", &msg.id())
            .await
            .map_err(HandlerError::transient)?
        {
            tx.execute(query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(&order))
                .await
                .map_err(HandlerError::transient)?;
        }
        tx.commit().await.map_err(HandlerError::transient)
    }
}

/// entrega's worker: a record that cannot be read is a permanent failure, dead-lettered at
/// once; the partition goes on. Returns the failed tries (one per poison message).
async fn with_the_worker(db: &Db, broker: &Broker, healthy: usize) -> anyhow::Result<u64> {
    let router = Router::new().route("pedido.creado", Arc::new(TakeStock { db: db.clone() }));
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        router,
        WorkerConfig::new(GROUP, TOPIC),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    let until = Instant::now() + RUN_FOR;
    while Instant::now() < until && !task.is_finished() {
        let applied: Option<i64> = db
            .scalar(query("SELECT COUNT(*) FROM lab_stock_moves"))
            .await?;
        let dead: i64 = broker.end_offsets(DLQ).await?.iter().map(|(_, e)| e).sum();
        if applied.unwrap_or(0) >= i64::try_from(healthy)? && dead >= POISON as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await??;
    Ok(broker
        .end_offsets(DLQ)
        .await?
        .iter()
        .map(|(_, e)| *e as u64)
        .sum())
}
