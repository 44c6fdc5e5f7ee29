//! Scenario 10: poison messages on a partition, on the embedded default. Two records of the
//! seed's choosing are malformed JSON (a permanent failure: no wait will fix them). The naive
//! consumer retries whatever fails, in place, with a growing pause, as at-least-once "and
//! nothing more" does; the pattern (entrega's worker) classifies the failure and sends a
//! permanent one to `<topic>.dlq` at once, with its reason, and the partition goes on.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::{query, Db, Migration};
use entrega::{
    Broker, CancellationToken, Handler, HandlerError, Message, MigrationSet, Router, Worker,
    WorkerConfig,
};
use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Envelope, Headers, OutgoingMessage};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::SeedableRng;
use serde_json::json;

use super::{Ledger, Side};

/// Messages on the partition.
const MESSAGES: usize = 40;
/// Of which poison.
const POISON: usize = 2;
const TOPIC: &str = "pedidos.eventos";
const DLQ: &str = "pedidos.eventos.dlq";
const GROUP: &str = "lab.inventario";
/// How long each side may run; what is not applied by then is stuck.
const RUN_FOR: Duration = Duration::from_secs(3);
/// The naive consumer's first pause before retrying; it doubles each time, up to a second.
const FIRST_PAUSE: Duration = Duration::from_millis(50);

const TABLES: &[Migration] = &[Migration::same(
    1,
    "the lab's stock moves",
    "CREATE TABLE IF NOT EXISTS lab_stock_moves (
         n        INTEGER PRIMARY KEY AUTOINCREMENT,
         order_id TEXT NOT NULL
     );",
)];

/// Runs one side in `dir` (created empty by the caller).
pub(super) async fn run(dir: &Path, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    let db = Db::connect(&format!("sqlite://{}", dir.join("inventario.db").display())).await?;
    let broker = Broker::connect(
        &format!("sqlite://{}", dir.join("log.db").display()),
        Duration::from_secs(10),
    )
    .await?;
    let result = run_on(&db, &broker, seed, side).await;
    broker.close().await;
    db.close().await;
    result
}

fn message(order: &str, poison: bool) -> OutgoingMessage {
    let envelope = Envelope::new("pedido.creado", "pedidos", json!({"id": order}));
    let payload = if poison {
        // Cut short: not JSON at all.
        let mut bytes = envelope.to_bytes();
        bytes.truncate(bytes.len() / 2);
        bytes
    } else {
        envelope.to_bytes()
    };
    OutgoingMessage {
        topic: TOPIC.to_owned(),
        key: Some(order.to_owned()),
        headers: Headers::new()
            .with(TIPO, "pedido.creado")
            .with(ID_EVENTO, envelope.id.to_string()),
        payload,
    }
}

async fn run_on(db: &Db, broker: &Broker, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Inbox]).await?;
    db.apply_migrations("lab", TABLES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    broker.admin().ensure_topic(DLQ, 1).await?;
    let orders: Vec<String> = (1..=MESSAGES).map(|n| format!("P-{n:03}")).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let poison: HashSet<String> = sample(&mut rng, MESSAGES, POISON)
        .into_iter()
        .filter_map(|i| orders.get(i).cloned())
        .collect();
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
    let applied: Vec<String> = db
        .fetch_all(query("SELECT order_id FROM lab_stock_moves ORDER BY n"))
        .await?
        .into_iter()
        .map(|(order,): (String,)| order)
        .collect();
    let mut ledger = Ledger::from_effects(&healthy, &applied);
    // Healthy orders not applied by the end were waiting behind a poison message.
    ledger.stuck = ledger.lost;
    ledger.lost = 0;
    let dead: i64 = broker.end_offsets(DLQ).await?.iter().map(|(_, e)| e).sum();
    let mut names: Vec<&String> = poison.iter().collect();
    names.sort();
    ledger.fault = format!(
        "{POISON} malformed messages ({}): {tries} failed tries, {dead} dead-lettered, in {} s",
        names
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", "),
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
