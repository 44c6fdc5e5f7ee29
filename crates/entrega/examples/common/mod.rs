//! The round trip both examples run, on whichever backend their URLs name: orders written with
//! their events in one transaction (outbox), published by the relay, applied once each by an
//! idempotent consumer, and a redelivery that changes nothing.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::{query, Db, Migration};
use entrega::{
    Broker, CancellationToken, Handler, Message, Relay, RelayConfig, Router, TopicRouting, Worker,
    WorkerConfig,
};
use entrega::{Envelope, HandlerError, MigrationSet, NewEvent, SystemClock};
use serde_json::json;

pub type BoxError = Box<dyn Error + Send + Sync>;

const TOPIC: &str = "pedidos.eventos";
const CONSUMER: &str = "ejemplo.descuento_stock";

/// The example's own tables, run by the same migration runner as entrega's.
const TABLES: &[Migration] = &[Migration::same(
    1,
    "pedidos and stock",
    "CREATE TABLE IF NOT EXISTS pedidos (id TEXT PRIMARY KEY, producto TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS stock (producto TEXT PRIMARY KEY, unidades INTEGER NOT NULL);
     INSERT INTO stock (producto, unidades) VALUES ('tomate-rosa', 10) ON CONFLICT DO NOTHING;",
)];

/// Takes two units per `pedido.creado`, once per event: the key and the effect commit in one
/// transaction.
struct TakeStock {
    db: Db,
}

#[async_trait]
impl Handler for TakeStock {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let classify = |e: entrega::StoreError| {
            if e.is_transient() {
                HandlerError::transient(e)
            } else {
                HandlerError::permanent(e)
            }
        };
        let product = msg.envelope.data["producto"]
            .as_str()
            .ok_or_else(|| HandlerError::permanent("datos.producto is missing"))?
            .to_owned();
        let mut tx = self.db.begin().await.map_err(classify)?;
        if !tx.claim(CONSUMER, &msg.id()).await.map_err(classify)? {
            return Ok(()); // Seen before: nothing to apply.
        }
        tx.execute(
            query("UPDATE stock SET unidades = unidades - 2 WHERE producto = $1").bind(product),
        )
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }
}

async fn units(db: &Db) -> Result<i64, BoxError> {
    let units: Option<i64> = db
        .scalar(
            query("SELECT CAST(unidades AS BIGINT) FROM stock WHERE producto = $1")
                .bind("tomate-rosa"),
        )
        .await?;
    Ok(units.unwrap_or(0))
}

/// Runs the round trip on the database at `db_url` and the broker at `broker_url`.
pub async fn round_trip(db_url: &str, broker_url: &str) -> Result<(), BoxError> {
    let db = Db::connect(db_url).await?;
    db.migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await?;
    db.apply_migrations("ejemplo", TABLES).await?;
    let broker = Broker::connect(broker_url, Duration::from_secs(10)).await?;
    broker.admin().ensure_topic(TOPIC, 3).await?;
    let before = units(&db).await?;

    // 1. Each order and its event in one transaction: both or neither.
    for n in 1..=3 {
        let id = format!("P-{n}");
        let mut tx = db.begin().await?;
        tx.execute(
            query("INSERT INTO pedidos (id, producto) VALUES ($1, $2)")
                .bind(&id)
                .bind("tomate-rosa"),
        )
        .await?;
        let datos = json!({ "pedido_id": id, "producto": "tomate-rosa" });
        tx.enqueue(&NewEvent::new("pedido", &id, "pedido.creado", datos))
            .await?;
        tx.commit().await?;
    }

    // 2. The relay publishes the outbox; 3. the worker applies each event once.
    let routing = TopicRouting::new().route("pedido", TOPIC);
    let relay = Relay::new(
        db.outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        RelayConfig::new("ejemplo", routing),
    );
    let handler = Arc::new(TakeStock { db: db.clone() });
    let router = Router::new().route("pedido.creado", handler.clone());
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        router,
        WorkerConfig::new("ejemplo", TOPIC),
    );
    let stop = CancellationToken::new();
    let relay_task = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let worker_task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.processed(CONSUMER).await? < 3 {
        if Instant::now() > deadline {
            return Err("the three events were not applied within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    relay_task.await??;
    worker_task.await??;
    let after = units(&db).await?;

    // 4. At-least-once delivery means a message may come again: the key makes it a no-op.
    let (partition, _) = broker
        .end_offsets(TOPIC)
        .await?
        .into_iter()
        .find(|(_, end)| *end > 0)
        .ok_or("nothing was published")?;
    let record = broker.read(TOPIC, partition, 0, 1).await?.remove(0);
    let again = Message {
        envelope: Envelope::parse(&record.payload)?,
        topic: record.topic,
        partition: record.partition,
        offset: record.offset,
        key: record.key,
        trace: entrega::trace::continued(record.headers.get("traceparent")),
        headers: record.headers,
        attempt: 2,
    };
    handler.handle(&again).await?;
    let redelivered = units(&db).await?;

    println!(
        "backend: {}, broker: {}",
        db.backend().name(),
        broker.kind()
    );
    println!("stock of tomate-rosa: {before} before, {after} after three orders, {redelivered} after a redelivery");
    println!(
        "keys recorded by {CONSUMER}: {}",
        db.processed(CONSUMER).await?
    );
    broker.close().await;
    db.close().await;
    if after != before - 6 || redelivered != after {
        return Err("the stock does not add up".into());
    }
    Ok(())
}
