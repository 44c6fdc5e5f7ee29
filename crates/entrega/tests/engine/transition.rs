//! Publishing both versions during a transition: the relay publishes each row of a type in
//! transition as the older version, then as its own, with one `id_evento` and the versions
//! listed in `entrega-versions`; consumers written for version 1, for version 2, and for
//! both each apply every order exactly once, from the copy they read; an event the older
//! version cannot express goes out at its own version only. On SQLite, the log on SQLite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::contracts::transition::VERSIONS;
use entrega::db::{query, Db, Migration};
use entrega::{
    Apply, Broker, CancellationToken, HandlerError, Idempotent, Message, MigrationSet, NewEvent,
    Record, Relay, RelayConfig, SystemClock, TopicRouting, Transitions, Tx, View, Worker,
    WorkerConfig,
};
use entrega_core::headers::ID_EVENTO;
use entrega_core::Envelope;
use serde::Deserialize;
use serde_json::{json, Value};

use support::TempDir;

const ORDERS: &str = "pedidos.eventos";

const APP: &[Migration] = &[Migration::same(
    1,
    "vistos",
    "CREATE TABLE IF NOT EXISTS vistos (consumidor TEXT NOT NULL, pedido TEXT NOT NULL, \
     version INTEGER NOT NULL)",
)];

/// What every consumer here reads: the order's id.
#[derive(Deserialize)]
struct Pedido<const V: u32> {
    id: String,
}

impl View for Pedido<1> {
    const TIPO: &'static str = "pedido.creado";
    const VERSIONS: &'static [u32] = &[1];
}

impl View for Pedido<2> {
    const TIPO: &'static str = "pedido.creado";
    const VERSIONS: &'static [u32] = &[2];
}

/// Reads both versions as they are.
#[derive(Deserialize)]
struct PedidoAny {
    id: String,
}

impl View for PedidoAny {
    const TIPO: &'static str = "pedido.creado";
    const VERSIONS: &'static [u32] = &[1, 2];
}

struct Note(&'static str);

async fn note(tx: &mut Tx, who: &str, id: String, msg: &Message) -> Result<(), HandlerError> {
    tx.execute(
        query("INSERT INTO vistos (consumidor, pedido, version) VALUES ($1, $2, $3)")
            .bind(who)
            .bind(id)
            .bind(i64::from(msg.envelope.version)),
    )
    .await?;
    Ok(())
}

#[async_trait]
impl Apply<Pedido<1>> for Note {
    async fn apply(&self, tx: &mut Tx, e: Pedido<1>, msg: &Message) -> Result<(), HandlerError> {
        note(tx, self.0, e.id, msg).await
    }
}

#[async_trait]
impl Apply<Pedido<2>> for Note {
    async fn apply(&self, tx: &mut Tx, e: Pedido<2>, msg: &Message) -> Result<(), HandlerError> {
        note(tx, self.0, e.id, msg).await
    }
}

#[async_trait]
impl Apply<PedidoAny> for Note {
    async fn apply(&self, tx: &mut Tx, e: PedidoAny, msg: &Message) -> Result<(), HandlerError> {
        note(tx, self.0, e.id, msg).await
    }
}

/// Version 2 as version 1: the address loses its postal code; one without a street cannot
/// be written as version 1.
fn down(mut datos: Value) -> Result<Value, String> {
    let address = datos["direccion_entrega"]
        .as_object_mut()
        .ok_or("no address")?;
    if !address.contains_key("calle") {
        return Err("version 1 requires a street".into());
    }
    address.remove("codigo_postal");
    Ok(datos)
}

fn order(id: &str, street: Option<&str>) -> NewEvent {
    let mut address = json!({"ciudad": "Girona", "codigo_postal": "17001"});
    if let Some(street) = street {
        address["calle"] = json!(street);
    }
    let mut event = NewEvent::new(
        "pedido",
        id,
        "pedido.creado",
        json!({"id": id, "direccion_entrega": address}),
    );
    event.version = 2;
    event
}

async fn all_records(broker: &Broker) -> Vec<Record> {
    let mut all = Vec::new();
    for (partition, end) in broker.end_offsets(ORDERS).await.unwrap() {
        all.extend(
            broker
                .read(ORDERS, partition, 0, usize::try_from(end).unwrap())
                .await
                .unwrap(),
        );
    }
    all
}

async fn caught_up(broker: &Broker, group: &str) -> bool {
    let ends = broker.end_offsets(ORDERS).await.unwrap();
    let committed = broker.committed(group, ORDERS).await.unwrap();
    ends.iter()
        .all(|(p, end)| committed.iter().any(|(q, c)| q == p && c == end))
}

async fn seen(db: &Db, who: &str) -> Vec<(String, i64)> {
    db.fetch_all(
        query("SELECT pedido, version FROM vistos WHERE consumidor = $1 ORDER BY pedido").bind(who),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_versions_published_each_consumer_applies_each_order_once() {
    let dir = TempDir::new();
    let db = Db::connect(&dir.url("app.db")).await.unwrap();
    db.migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await
        .unwrap();
    db.apply_migrations("app", APP).await.unwrap();
    let broker = Broker::connect(&dir.url("broker.db"), Duration::from_secs(10))
        .await
        .unwrap();
    broker.admin().ensure_topic(ORDERS, 1).await.unwrap();
    broker
        .admin()
        .ensure_topic(&format!("{ORDERS}.dlq"), 1)
        .await
        .unwrap();

    let mut tx = db.begin().await.unwrap();
    tx.enqueue_all(&[
        order("P-1", Some("Carrer Nou 1")),
        order("P-2", None),
        order("P-3", Some("Rambla 2")),
    ])
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let transitions = Transitions::new().publish_also("pedido.creado", 2, 1, down);
    let relay = Relay::new(
        db.outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        RelayConfig::new("pedidos", TopicRouting::new().route("pedido", ORDERS))
            .with_transitions(transitions),
    );
    let consumers = [
        (
            "v1",
            Idempotent::new(db.clone(), "solo.v1").on::<Pedido<1>>(Note("v1")),
        ),
        (
            "v2",
            Idempotent::new(db.clone(), "solo.v2").on::<Pedido<2>>(Note("v2")),
        ),
        (
            "ambas",
            Idempotent::new(db.clone(), "ambas").on::<PedidoAny>(Note("ambas")),
        ),
    ];
    let stats: Vec<_> = consumers.iter().map(|(_, c)| c.stats()).collect();
    let stop = CancellationToken::new();
    let mut tasks = vec![tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await.map_err(|e| e.to_string()) }
    })];
    for (group, consumer) in consumers {
        let worker = Worker::new(
            broker.subscriber(),
            broker.publisher(),
            consumer.router(),
            WorkerConfig::new(group, ORDERS),
        );
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            worker.run(stop).await.map_err(|e| e.to_string())
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let total = broker.topic_total(ORDERS).await.unwrap();
        let mut done = total == 5;
        for group in ["v1", "v2", "ambas"] {
            done = done && caught_up(&broker, group).await;
        }
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "published and consumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    // The log: P-1 and P-3 twice, version 1 first, one id_evento; P-2 once, at version 2
    // (order holds per key; lanes interleave keys).
    let mut records = all_records(&broker).await;
    records.sort_by_key(|r| r.key.clone());
    let shape: Vec<(String, u32, Option<String>)> = records
        .iter()
        .map(|r| {
            let envelope = Envelope::parse(&r.payload).unwrap();
            assert_eq!(
                r.headers.get(ID_EVENTO),
                Some(envelope.id.to_string().as_str())
            );
            (
                r.key.clone().unwrap(),
                envelope.version,
                r.headers.get(VERSIONS).map(str::to_owned),
            )
        })
        .collect();
    let both = Some("1,2".to_owned());
    assert_eq!(
        shape,
        [
            ("P-1".to_owned(), 1, both.clone()),
            ("P-1".to_owned(), 2, both.clone()),
            ("P-2".to_owned(), 2, None),
            ("P-3".to_owned(), 1, both.clone()),
            ("P-3".to_owned(), 2, both),
        ]
    );
    let v1 = Envelope::parse(&records[0].payload).unwrap();
    let v2 = Envelope::parse(&records[1].payload).unwrap();
    assert_eq!(v1.id, v2.id, "one fact, one id_evento");
    assert_eq!(
        v1.data["direccion_entrega"],
        json!({"ciudad": "Girona", "calle": "Carrer Nou 1"})
    );
    assert_eq!(v2.data["direccion_entrega"]["codigo_postal"], "17001");

    // Each consumer applied each order it can read once, from the copy it reads.
    let at = |version: i64, ids: &[&str]| -> Vec<(String, i64)> {
        ids.iter().map(|id| ((*id).to_owned(), version)).collect()
    };
    assert_eq!(seen(&db, "v1").await, at(1, &["P-1", "P-3"]));
    assert_eq!(seen(&db, "v2").await, at(2, &["P-1", "P-2", "P-3"]));
    assert_eq!(seen(&db, "ambas").await, at(2, &["P-1", "P-2", "P-3"]));
    // The copies left to the other one: acknowledged without claiming their key.
    let copies: Vec<u64> = stats.iter().map(|s| s.copies()).collect();
    assert_eq!(copies, [2, 2, 2]);
    let applied: Vec<u64> = stats.iter().map(|s| s.applied()).collect();
    assert_eq!(applied, [2, 3, 3]);
    // P-2, only at version 2, is past what the version 1 consumer reads: a dead letter.
    assert_eq!(stats[0].failed(), 1);
    broker.close().await;
    db.close().await;
}
