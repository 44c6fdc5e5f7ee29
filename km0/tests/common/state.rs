//! What a crash test asserts on: the rows of a deployment's databases (orders, outbox, stock,
//! idempotency keys, relay lanes) and its log (records, committed offsets), read through the
//! library APIs or plain SQL. Plus bounded waiting and placing orders over HTTP.

#![allow(clippy::panic)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use entrega::db::{query, Db};
use entrega_core::{NewEvent, Record};
use km0::services::inventario::{StockStore, CONSUMER, GROUP};
use km0::services::pedidos::TOPIC;
use km0::wiring::{Broker, System};
use serde_json::{json, Value};

/// Polls `check` until it returns `Some`, failing the test after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A `pedido.creado` v1 of order `key` for `quantity` of `product`, as another producer
/// (`tienda-externa`) would publish it straight to km0's topic: its `id_evento` and the
/// record.
pub fn foreign_order(
    key: &str,
    product: &str,
    quantity: i64,
) -> (String, entrega::OutgoingMessage) {
    use entrega::headers::{ID_EVENTO, TIPO};
    let event_id = uuid::Uuid::new_v4().to_string();
    let envelope = json!({"id_evento": event_id, "tipo": "pedido.creado", "version": 1,
        "fecha_ms": 1_764_000_000_000i64, "origen": "tienda-externa",
        "datos": {"id": key, "cliente": "ana", "mercado": "girona",
                  "lineas": [{"producto": product, "cantidad": quantity, "precio_centimos": 900}]}});
    let message = entrega::OutgoingMessage {
        topic: TOPIC.to_owned(),
        key: Some(key.to_owned()),
        headers: entrega::Headers::new()
            .with(TIPO, "pedido.creado")
            .with(ID_EVENTO, event_id.clone()),
        payload: serde_json::to_vec(&envelope).unwrap(),
    };
    (event_id, message)
}

/// A `pedido.creado` request body with `lines` of (product, quantity).
pub fn order(id: &str, lines: &[(&str, i64)]) -> Value {
    let lines: Vec<Value> = lines
        .iter()
        .map(|(p, q)| json!({"producto": p, "cantidad": q, "precio_centimos": 150}))
        .collect();
    json!({"id": id, "cliente": "ana", "mercado": "girona", "lineas": lines})
}

/// Posts an order; the HTTP status and the JSON body, or the transport error's text when the
/// server went away mid-request.
pub async fn post_order(addr: SocketAddr, body: &Value) -> Result<(u16, Value), String> {
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/pedidos"))
        .timeout(Duration::from_secs(20))
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.json().await.map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// Places an order that must be accepted; returns its `id_evento`.
pub async fn place(addr: SocketAddr, body: &Value) -> String {
    let (status, answer) = post_order(addr, body).await.expect("pedidos answers");
    assert_eq!(status, 201, "order refused: {answer}");
    answer["id_evento"]
        .as_str()
        .expect("id_evento in the answer")
        .to_owned()
}

/// The deployment's databases, opened once for a test.
pub struct DbState {
    /// The pedidos database (orders, lines, outbox, relay lanes).
    pub pedidos: Db,
    /// The inventario database (stock, processed messages).
    pub inventario: Db,
    /// The broker.
    pub broker: Broker,
}

impl DbState {
    /// Opens (and migrates) every database of `system`.
    pub async fn open(system: &System) -> Self {
        Self {
            pedidos: system.pedidos().await.expect("pedidos db").db().clone(),
            inventario: system
                .inventario()
                .await
                .expect("inventario db")
                .db()
                .clone(),
            broker: system.broker_log().await.expect("broker"),
        }
    }

    /// Closes every pool.
    pub async fn close(&self) {
        self.pedidos.close().await;
        self.inventario.close().await;
        self.broker.close().await;
    }

    /// The stock store, for reading and setting units.
    pub fn stock_store(&self) -> StockStore {
        StockStore::new(self.inventario.clone())
    }

    /// Units of every product.
    pub async fn stock(&self) -> BTreeMap<String, i64> {
        self.stock_store()
            .all()
            .await
            .expect("stock")
            .into_iter()
            .collect()
    }

    /// Idempotency keys recorded by the stock consumer, sorted.
    pub async fn keys(&self) -> Vec<String> {
        let sql = "SELECT id_mensaje FROM mensajes_procesados WHERE consumidor = $1 \
                   ORDER BY id_mensaje";
        let rows: Vec<(String,)> = self
            .inventario
            .fetch_all(query(sql).bind(CONSUMER))
            .await
            .expect("keys");
        rows.into_iter().map(|(key,)| key).collect()
    }

    /// Outbox rows still waiting for the relay (`publicado_en IS NULL`).
    pub async fn pending(&self) -> i64 {
        count(
            &self.pedidos,
            "SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL",
        )
        .await
    }

    /// Lanes of the relay as (lane, owner, lease expiry in epoch ms).
    pub async fn lanes(&self) -> Vec<(i64, Option<String>, i64)> {
        let sql = "SELECT CAST(lane AS BIGINT), owner, expires_at_ms FROM entrega_relay_lanes \
                   ORDER BY lane";
        self.pedidos
            .fetch_all(query(sql))
            .await
            .expect("relay lanes")
    }

    /// Every record of `topic`, partition by partition, in offset order.
    pub async fn records(&self, topic: &str) -> Vec<Record> {
        let mut all = Vec::new();
        for (partition, end) in self.end_offsets(topic).await {
            let max = usize::try_from(end).unwrap_or(0);
            all.extend(
                self.broker
                    .read(topic, partition, 0, max)
                    .await
                    .expect("read log"),
            );
        }
        all
    }

    /// Next offset to be written per partition of `topic`.
    pub async fn end_offsets(&self, topic: &str) -> Vec<(u32, i64)> {
        self.broker.end_offsets(topic).await.expect("end offsets")
    }

    /// Committed next offsets of the inventario group per partition of the orders topic.
    pub async fn committed(&self) -> BTreeMap<u32, i64> {
        self.broker
            .committed(GROUP, TOPIC)
            .await
            .expect("committed offsets")
            .into_iter()
            .collect()
    }

    /// Whether the inventario group committed every record of the orders topic (and the topic
    /// holds `records` of them).
    pub async fn consumed_all(&self, records: i64) -> bool {
        let total: i64 = self
            .end_offsets(TOPIC)
            .await
            .iter()
            .map(|(_, end)| end)
            .sum();
        total == records && self.consumer_caught_up().await
    }

    /// Whether the inventario group committed every record the orders topic holds.
    pub async fn consumer_caught_up(&self) -> bool {
        let ends = self.end_offsets(TOPIC).await;
        let committed = self.committed().await;
        ends.iter()
            .all(|(p, end)| *end == 0 || committed.get(p) == Some(end))
    }
}

/// Commits `events` to the outbox of `db` in one transaction, as a producer would.
pub async fn enqueue(db: &Db, events: &[NewEvent]) {
    let mut tx = db.begin().await.unwrap();
    tx.enqueue_all(events).await.unwrap();
    tx.commit().await.unwrap();
}

/// `SELECT COUNT(*) ...` (or any single BIGINT) on either backend.
pub async fn count(db: &Db, sql: &str) -> i64 {
    db.scalar::<i64>(query(sql.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

/// The stock `before` less what `orders` took, per product.
pub fn taken(before: &BTreeMap<String, i64>, orders: &[&[(&str, i64)]]) -> BTreeMap<String, i64> {
    let mut after = before.clone();
    for lines in orders {
        for (product, quantity) in *lines {
            *after.get_mut(*product).expect("known product") -= quantity;
        }
    }
    after
}
