//! `km0 demo` on a broker others use: 10,000 `pedido.creado` of another deployment wait on
//! the shared topic (and, on RabbitMQ, in the shared groups' queues), then the demo runs
//! twice. Each run must pass, and leave the shared names as it found them: the foreign
//! records unread (no offset committed, every queued message still there), nothing of the
//! runs' own left behind (their namespace's topics, groups and queues deleted, their
//! databases dropped).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use entrega::Broker;
use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Envelope, Headers, OutgoingMessage};
use km0::demo::DemoOptions;
use km0::services::{inventario, pedidos};
use km0::wiring::{ensure_topics, System};
use serde_json::json;

const FOREIGN: usize = 10_000;
const BATCH: usize = 500;

fn options(seed: u64) -> DemoOptions {
    DemoOptions {
        orders: 30,
        concurrency: 8,
        fresh: true,
        keep: false,
        timeout: Duration::from_secs(120),
        seed,
        progress: false,
        redeliver: 7,
        saga: true,
        json: true,
    }
}

/// Another deployment's orders: valid events for the demo's own products, which would change
/// its stock and its counts if it read them.
fn foreign_order(n: usize) -> OutgoingMessage {
    let id = format!("FOREIGN-{n:06}");
    let datos = json!({"id": id, "cliente": "otra", "mercado": "girona",
        "direccion_entrega": {"ciudad": "Madrid", "codigo_postal": "28001", "calle": "Gran Via 1"},
        "lineas": [{"producto": "tomate-rosa", "cantidad": 2, "precio_centimos": 350}]});
    let envelope = Envelope::new("pedido.creado", "pedidos", datos);
    OutgoingMessage {
        topic: pedidos::TOPIC.to_owned(),
        key: Some(id),
        headers: Headers::new()
            .with(TIPO, "pedido.creado")
            .with(ID_EVENTO, envelope.id.to_string()),
        payload: envelope.to_bytes(),
    }
}

/// Creates km0's shared topics (and, on RabbitMQ, its groups' queues), as `km0 up` on this
/// broker would, and publishes the foreign orders there.
async fn foreign_load(broker: &Broker) {
    ensure_topics(broker).await.unwrap();
    let publisher = broker.publisher();
    let all: Vec<OutgoingMessage> = (0..FOREIGN).map(foreign_order).collect();
    for batch in all.chunks(BATCH) {
        publisher.publish(batch).await.unwrap();
    }
}

/// What the shared names hold: each topic's end offsets and the stock consumer's committed
/// ones on a log; on RabbitMQ, what each of the stock consumer's queues holds.
async fn shared_state(broker: &Broker) -> BTreeMap<String, i64> {
    let mut state = BTreeMap::new();
    if let Some(amqp) = broker.as_amqp() {
        let names = amqp.group_queues(inventario::GROUP, inventario::TOPIC);
        let mut queues = names.queues();
        queues.push(names.dead_letter_queue());
        for depth in amqp.queue_depths(&queues).await.unwrap() {
            let held = depth.ready + depth.unacked.unwrap_or(0);
            state.insert(depth.queue, i64::try_from(held).unwrap());
        }
        return state;
    }
    for topic in km0::wiring::topics() {
        for (p, end) in broker.end_offsets(topic).await.unwrap() {
            state.insert(format!("{topic}[{p}] end"), end);
        }
    }
    for (p, next) in broker
        .committed(inventario::GROUP, inventario::TOPIC)
        .await
        .unwrap()
    {
        state.insert(format!("{}[{p}] committed", inventario::GROUP), next);
    }
    state
}

async fn demos_leave_the_shared_broker_as_they_found_it(system: &System) -> Broker {
    let broker = system.broker().await.unwrap();
    foreign_load(&broker).await;
    let before = shared_state(&broker).await;
    let queued: i64 = before.values().sum();
    assert!(
        queued >= FOREIGN as i64,
        "the foreign load is there: {before:?}"
    );
    for seed in [3, 4] {
        let report = km0::demo::run(system, &options(seed)).await.unwrap();
        assert!(report.passed(), "{}", report.render());
        assert_eq!(report.orders_accepted, 30, "{}", report.render());
        assert_eq!(
            shared_state(&broker).await,
            before,
            "the demo touched the shared names"
        );
    }
    broker
}

/// A deployment on PostgreSQL databases of a short prefix of its own (a fresh run's names
/// add to it, and PostgreSQL stops at 63 bytes) with `broker`, or the log in a database of
/// the prefix.
fn on_postgres(broker: Option<String>) -> System {
    use km0::wiring::config::{DataPlace, Databases};
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let prefix = format!("entrega_t_{id}_");
    let broker = broker.unwrap_or_else(|| format!("{}/{prefix}broker", common::pg_server()));
    let databases = Databases {
        place: DataPlace::PostgresServer(common::pg_server()),
        prefix: Some(prefix),
    };
    System::new(databases, broker).with_lease_ttl(Duration::from_secs(2))
}

/// Topic and consumer group names of the Kafka cluster at `bootstrap`.
fn kafka_names(bootstrap: &str) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let client: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    let metadata = client.fetch_metadata(None, timeout).unwrap();
    let groups = client.fetch_group_list(None, timeout).unwrap();
    metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .chain(groups.groups().iter().map(|g| g.name().to_owned()))
        .collect()
}

fn left_behind(names: Vec<String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|name| name.starts_with("km0-demo-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka() {
    let kafka = common::kafka::KafkaBroker::start();
    let system = on_postgres(Some(format!("{}?session_timeout_ms=6000", kafka.url())));
    let broker = demos_leave_the_shared_broker_as_they_found_it(&system).await;
    let left = left_behind(kafka_names(&kafka.bootstrap()));
    assert!(
        left.is_empty(),
        "the runs left topics or groups behind: {left:?}"
    );
    // The shared names stay, with the foreign records.
    assert!(kafka_names(&kafka.bootstrap()).contains(&pedidos::TOPIC.to_owned()));
    broker.close().await;
    system.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq() {
    let vhost = common::amqp::Vhost::create();
    let system = on_postgres(Some(format!("{}?shards=4", vhost.url())));
    let broker = demos_leave_the_shared_broker_as_they_found_it(&system).await;
    let left = left_behind(
        vhost
            .queues()
            .into_iter()
            .chain(vhost.exchanges())
            .collect(),
    );
    assert!(
        left.is_empty(),
        "the runs left queues or exchanges behind: {left:?}"
    );
    broker.close().await;
    system.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_log() {
    let system = on_postgres(None);
    let broker = demos_leave_the_shared_broker_as_they_found_it(&system).await;
    broker.close().await;
    // A fresh run's databases, the log's included, are named after the deployment's prefix
    // and "demo".
    let prefix = system.databases().prefix.clone().unwrap();
    let left = common::databases_like(&format!("{prefix}%demo%")).await;
    assert!(left.is_empty(), "the runs left databases behind: {left:?}");
    system.destroy().await.unwrap();
}
