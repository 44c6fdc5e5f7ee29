//! Competing consumers on a real RabbitMQ (`ENTREGA_TEST_AMQP`), as the seed's section 5 puts
//! it: on one plain shared queue two members reorder one order's `pedido.creado` and
//! `pedido.cancelado` (RabbitMQ hands consecutive messages to different members, and the one
//! with the cancel finishes first); on the sharded layout, one key's messages always go to one
//! shard with a single active consumer, and the same workload is never reordered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use entrega_amqp::{Amqp, AmqpConfig, GroupSpec, QueueLayout};
use entrega_core::{Headers, OutgoingMessage, Subscription};
use lapin::options::ExchangeDeleteOptions;
use lapin::{Connection, ConnectionProperties};

/// Orders in the workload, each a `pedido.creado` then a `pedido.cancelado`.
const ORDERS: usize = 24;
/// How much longer a `pedido.creado` takes to handle than a cancel (it touches stock).
const CREATE_TAKES: Duration = Duration::from_millis(40);

fn url() -> String {
    std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}.{}", uuid::Uuid::new_v4().simple())
}

fn order_events(topic: &str, prefix: &str) -> Vec<OutgoingMessage> {
    (0..ORDERS)
        .flat_map(|k| ["pedido.creado", "pedido.cancelado"].map(|tipo| (k, tipo)))
        .map(|(k, tipo)| OutgoingMessage {
            topic: topic.to_owned(),
            key: Some(format!("{prefix}-{k}")),
            headers: Headers::new()
                .with("id_evento", uuid::Uuid::new_v4().to_string())
                .with("tipo", tipo),
            payload: b"{}".to_vec(),
        })
        .collect()
}

/// Completed handlings, in the order they finished: (key, tipo, id_evento, member).
type Finished = Arc<Mutex<Vec<(String, String, String, &'static str)>>>;

/// A member that handles one delivery at a time (a create takes longer), records when each
/// finished, and acks it after; until `stop`.
fn member(
    name: &'static str,
    mut sub: Box<dyn Subscription>,
    finished: Finished,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let records = sub.poll(1, Duration::from_millis(50)).await.unwrap();
            for r in records {
                let tipo = r.headers.get("tipo").unwrap_or_default().to_owned();
                if tipo == "pedido.creado" {
                    tokio::time::sleep(CREATE_TAKES).await;
                }
                finished.lock().unwrap().push((
                    r.key.clone().unwrap_or_default(),
                    tipo,
                    r.headers.get("id_evento").unwrap_or_default().to_owned(),
                    name,
                ));
                sub.commit(&[(r.partition, r.offset + 1)]).await.unwrap();
            }
        }
        sub.close().await.unwrap();
    })
}

/// Waits until every event of `prefix` finished at least once (60 s at most).
async fn until_finished(finished: &Finished, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done: HashSet<String> = finished
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _, _, _)| k.starts_with(prefix))
            .map(|(_, _, id, _)| id.clone())
            .collect();
        if done.len() >= 2 * ORDERS {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} events finished",
            done.len(),
            2 * ORDERS
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Orders of `prefix` whose cancel finished before their creation did (first finish of each).
fn reordered(finished: &Finished, prefix: &str) -> usize {
    let mut first: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for (key, tipo, id, _) in finished.lock().unwrap().iter() {
        if key.starts_with(prefix) && seen.insert(id.clone()) {
            first.entry(key.clone()).or_default().push(tipo.clone());
        }
    }
    assert_eq!(first.len(), ORDERS);
    first
        .values()
        .filter(|tipos| tipos.first().map(String::as_str) == Some("pedido.cancelado"))
        .count()
}

/// Runs the workload through two members of one group in `layout`; returns the orders
/// reordered.
async fn run(layout: QueueLayout) -> usize {
    let amqp =
        Amqp::connect(AmqpConfig::from_url(&format!("{}?shards=6&prefetch=1", url())).unwrap());
    let (group, topic) = (unique("g"), unique("t"));
    amqp.set_group(&group, &topic, GroupSpec { base: None, layout });
    let finished: Finished = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for name in ["m1", "m2"] {
        let sub = amqp
            .subscriber()
            .subscribe(&group, &topic, name)
            .await
            .unwrap();
        tasks.push(member(name, sub, finished.clone(), stop.clone()));
    }
    // A first round lets the sharded members settle who holds which shard (a hand-over
    // returns the held deliveries to the queue), then the measured one runs.
    amqp.publisher()
        .publish(&order_events(&topic, "W"))
        .await
        .unwrap();
    until_finished(&finished, "W").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    amqp.publisher()
        .publish(&order_events(&topic, "P"))
        .await
        .unwrap();
    until_finished(&finished, "P").await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let n = reordered(&finished, "P");
    let members: HashSet<&str> = finished
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _, _, _)| k.starts_with('P'))
        .map(|(_, _, _, m)| *m)
        .collect();
    assert_eq!(members.len(), 2, "only {members:?} handled the workload");
    amqp.delete_group(&group, &topic).await.unwrap();
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let _ = channel
        .exchange_delete(topic.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_competing_consumers_reorder_an_orders_events() {
    let n = run(QueueLayout::Shared).await;
    assert!(
        n > 0,
        "no order had its cancel handled before its creation on the shared queue"
    );
    eprintln!("shared queue: {n} of {ORDERS} orders reordered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_single_active_consumer_queues_never_reorder() {
    assert_eq!(run(QueueLayout::Sharded).await, 0);
}
