//! km0 whole on RabbitMQ, in a virtual host of its own: HTTP → outbox → relay → the
//! `pedidos.eventos` exchange → inventario's shard queues (`inventario.pedidos.<i>`) →
//! stock, with the services' databases on SQLite and on PostgreSQL. Every order applied
//! once, a poison order in `inventario.pedidos.dlq` with its `motivo` while the rest flow,
//! every delivery acked, and `km0 dlq` replaying and discarding from the queue.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use entrega::dlq::{DiscardOptions, DlqFilter, QueueDeadLetters, ReplayOptions};
use entrega_core::headers::{INTENTOS, MOTIVO};
use entrega_core::MigrationSet;
use km0::services::inventario::{GROUP, TOPIC};
use km0::wiring::{Components, System};
use serde_json::Value;

use common::amqp::Vhost;
use common::state::{eventually, order, place, taken, DbState};

/// Orders placed over HTTP.
const ORDERS: usize = 30;

fn on_rabbitmq(backend: &str, vhost: &Vhost) -> System {
    let databases = common::test_system(backend).databases().clone();
    System::new(databases, format!("{}?shards=6", vhost.url()))
        .with_lease_ttl(Duration::from_secs(2))
}

fn lines(n: usize) -> Vec<(&'static str, i64)> {
    const PRODUCTS: [&str; 4] = ["tomate-rosa", "calabacin", "queso-fresco", "vino-crianza"];
    let quantity = i64::try_from(n % 3 + 1).unwrap();
    vec![(PRODUCTS[n % 4], quantity)]
}

/// Ready messages in each of inventario's queues and its dead-letter queue, by name.
async fn depths(system: &System) -> Vec<(String, u64)> {
    let broker = system.broker().await.unwrap();
    let amqp = broker.as_amqp().unwrap();
    let names = amqp.group_queues(GROUP, TOPIC);
    let mut all = names.queues();
    all.push(names.dead_letter_queue());
    let out = amqp
        .queue_depths(&all)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.queue, d.ready))
        .collect();
    broker.close().await;
    out
}

async fn orders_flow_through_rabbitmq_once_each(backend: &str) {
    let vhost = Vhost::create();
    let system = on_rabbitmq(backend, &vhost);
    let state = DbState::open(&system).await;
    let before = state.stock().await;
    let running = system
        .start(Components::all("amqp-e2e"), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();

    let mut event_ids = BTreeSet::new();
    let mut placed = Vec::new();
    for n in 0..ORDERS {
        let order_lines = lines(n);
        event_ids.insert(place(addr, &order(&format!("R-{n:03}"), &order_lines)).await);
        placed.push(order_lines);
    }
    // More queso-curado than there is: refused for good, dead-lettered, the rest goes on.
    let poison = place(addr, &order("R-poison", &[("queso-curado", 50)])).await;

    eventually(
        Duration::from_secs(90),
        "every order applied and the poison one dead-lettered",
        || async {
            let keys = state.keys().await.len();
            let dlq = depths(&system).await.last().map_or(0, |(_, n)| *n);
            (state.pending().await == 0 && keys == ORDERS && dlq == 1).then_some(())
        },
    )
    .await;
    running.stop().await.unwrap();

    // Every order applied exactly once; the poison one never.
    let keys: BTreeSet<String> = state.keys().await.into_iter().collect();
    assert_eq!(keys, event_ids);
    let orders: Vec<&[(&str, i64)]> = placed.iter().map(Vec::as_slice).collect();
    assert_eq!(state.stock().await, taken(&before, &orders));
    // Every delivery was acked: once the consumers are gone, nothing is back in the queues.
    let depths = depths(&system).await;
    let (dlq, shards) = depths.split_last().unwrap();
    assert_eq!(shards.len(), 6);
    for (queue, ready) in shards {
        assert_eq!(*ready, 0, "{queue} still holds messages");
    }
    assert_eq!(dlq.0, "inventario.pedidos.dlq");

    // The dead letter, read as an operator would: the poison order with its reason.
    let broker = system.broker().await.unwrap();
    let db = system
        .databases()
        .connect(&km0::services::inventario::DATABASE)
        .await
        .unwrap();
    db.migrate(&[MigrationSet::Dlq]).await.unwrap();
    let tool = QueueDeadLetters::new(
        broker.as_amqp().unwrap().clone(),
        GROUP,
        TOPIC,
        db.dead_letters(),
    );
    let letters = tool.list(&DlqFilter::all()).await.unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.event_id.as_deref(), Some(poison.as_str()));
    assert!(
        letter.reason.contains("queso-curado"),
        "motivo: {}",
        letter.reason
    );
    assert_eq!(letter.headers.get(INTENTOS), Some("1"));
    assert!(letter.headers.get(MOTIVO).is_some());
    let payload: Value = serde_json::from_slice(&letter.payload).unwrap();
    assert_eq!(payload["datos"]["id"], "R-poison");
    // Listing left it where it was.
    assert_eq!(tool.list(&DlqFilter::all()).await.unwrap().len(), 1);

    // A dry-run replay changes nothing; a discard takes it off the queue, audited.
    let mut dry = ReplayOptions::new("ops");
    dry.dry_run = true;
    let report = tool.replay(&DlqFilter::all(), &dry).await.unwrap();
    assert_eq!(report.applied.len(), 1);
    assert_eq!(tool.list(&DlqFilter::all()).await.unwrap().len(), 1);
    let report = tool
        .discard(
            &DlqFilter::all(),
            &DiscardOptions::new("ops", "order cancelled by phone"),
        )
        .await
        .unwrap();
    assert_eq!(report.applied.len(), 1);
    assert!(tool.list(&DlqFilter::all()).await.unwrap().is_empty());
    let audit = tool.audit(10).await.unwrap();
    assert_eq!(audit.len(), 2);
    assert!(audit[0]
        .detail
        .as_deref()
        .unwrap_or_default()
        .contains(&poison));
    assert!(!audit[0].dry_run && audit[1].dry_run);

    broker.close().await;
    db.close().await;
    state.close().await;
    system.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_flow_through_rabbitmq_once_each_on_sqlite() {
    orders_flow_through_rabbitmq_once_each("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_flow_through_rabbitmq_once_each_on_postgres() {
    orders_flow_through_rabbitmq_once_each("postgres").await;
}

/// `km0 demo` on RabbitMQ: its invariants hold, and the events it publishes again (taken from
/// its tap group, since a queue keeps no log) are all absorbed as duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_holds_its_invariants_on_rabbitmq() {
    let vhost = Vhost::create();
    let system = on_rabbitmq("sqlite", &vhost);
    let options = km0::demo::DemoOptions {
        orders: 120,
        concurrency: 8,
        fresh: false,
        keep: true,
        timeout: Duration::from_secs(90),
        seed: 5,
        progress: false,
        redeliver: 10,
        saga: false,
        json: false,
    };
    let report = km0::demo::run(&system, &options).await.unwrap();
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.consumed, 120);
    assert_eq!(report.redelivered, 10);
    assert_eq!(report.duplicates, 10);
    assert_eq!(report.messages_on_topic, None);
    // The tap group is gone with its queues, and inventario's hold nothing.
    let queues = vhost.queues();
    assert!(
        queues.iter().any(|q| q == "inventario.pedidos.0"),
        "{queues:?}"
    );
    assert!(
        !queues.iter().any(|q| q.starts_with("km0-demo-tap-")),
        "{queues:?}"
    );
    let broker = system.broker().await.unwrap();
    let amqp = broker.as_amqp().unwrap();
    let remaining = amqp
        .queue_depths(&amqp.group_queues(GROUP, TOPIC).queues())
        .await
        .unwrap();
    assert!(remaining.iter().all(|d| d.exists && d.ready == 0));
    broker.close().await;
    system.destroy().await.unwrap();
}
