//! Scenario: competing consumers on a real RabbitMQ. Two instances of inventario consume
//! `pedido.creado` and then `pedido.cancelado` of each order; applying a few orders' creation
//! is slow (a busy moment of the database), chosen by the seed. The naive side is the seed's
//! plain shared queue (`layout=shared`, one message in flight per instance): RabbitMQ hands
//! the cancellation to the idle instance while the other still applies the creation. The
//! pattern is entrega's sharded layout: a key always lands in the same quorum queue, which
//! one instance at a time consumes (single active consumer), so one order's events are
//! applied in the order published.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use entrega::db::{query, Db, Migration};
use entrega::Broker;
use entrega_core::{Envelope, OutgoingMessage, Subscription};
use serde_json::json;

use super::brokers::{amqp_url, with_broker};
use super::embedded::{event, listed, order_ids, picked};
use super::{Ledger, Side, SideRun};

/// Orders, each created then cancelled.
const ORDERS: usize = 30;
/// Orders whose creation is slow to apply.
const SLOW: usize = 3;
/// How long a slow creation takes.
const SLOW_FOR: Duration = Duration::from_millis(300);
/// Instances consuming at once.
const INSTANCES: usize = 2;
const TOPIC: &str = "pedidos.eventos";
const GROUP: &str = "inventario";
/// How long a side may take before what is left counts as lost.
const WITHIN: Duration = Duration::from_secs(30);

/// The events applied, in the order applied.
const APPLIED: &[Migration] = &[Migration::same(
    1,
    "the lab's applied order events",
    "CREATE TABLE IF NOT EXISTS lab_order_events (
         n        INTEGER PRIMARY KEY AUTOINCREMENT,
         order_id TEXT NOT NULL,
         tipo     TEXT NOT NULL
     );",
)];

/// Runs one side under a namespace of its own on the lab's RabbitMQ, removed after.
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let params = match r.side {
        Side::Naive => "layout=shared&prefetch=1",
        Side::Pattern => "layout=sharded",
    };
    let url = amqp_url(&r.brokers, &r.namespace, params);
    let what = format!("RabbitMQ at {}", r.brokers.rabbitmq);
    with_broker(&url, &what, async |broker| {
        let db = Db::connect(&format!(
            "sqlite://{}",
            r.dir.join("inventario.db").display()
        ))
        .await?;
        let result = run_on(broker, &db, r).await;
        db.close().await;
        result.with_context(|| format!("the {} side", r.side.name()))
    })
    .await
}

async fn run_on(broker: &Broker, db: &Db, r: &SideRun) -> anyhow::Result<Ledger> {
    db.apply_migrations("lab", APPLIED).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    broker.declare_group(GROUP, TOPIC).await?;
    let orders = order_ids(ORDERS);
    let slow = picked(r.seed, &orders, SLOW);
    let mut subs = Vec::with_capacity(INSTANCES);
    for i in 0..INSTANCES {
        subs.push(
            broker
                .subscriber()
                .subscribe(GROUP, TOPIC, &format!("lab-{i}"))
                .await?,
        );
    }
    let events: Vec<OutgoingMessage> = orders
        .iter()
        .flat_map(|o| {
            [
                event(TOPIC, "pedido.creado", o, json!({"id": o})),
                event(TOPIC, "pedido.cancelado", o, json!({"id": o})),
            ]
        })
        .collect();
    broker.publisher().publish(&events).await?;
    let expected = events.len();
    let deadline = Instant::now() + WITHIN;
    let instances = subs
        .iter_mut()
        .map(|sub| consume(db, sub.as_mut(), &slow, expected, deadline));
    for done in futures::future::join_all(instances).await {
        done?;
    }
    for mut sub in subs {
        sub.close().await?;
    }

    let rows: Vec<(String, String)> = db
        .fetch_all(query(
            "SELECT order_id, tipo FROM lab_order_events ORDER BY n",
        ))
        .await?;
    let placed: Vec<String> = orders
        .iter()
        .flat_map(|o| {
            [
                format!("{o} pedido.creado"),
                format!("{o} pedido.cancelado"),
            ]
        })
        .collect();
    let applied: Vec<String> = rows.iter().map(|(o, t)| format!("{o} {t}")).collect();
    let mut ledger = Ledger::from_effects(&placed, &applied);
    ledger.out_of_order = orders
        .iter()
        .filter(|o| {
            let at = |tipo: &str| rows.iter().position(|(id, t)| id == *o && t == tipo);
            matches!((at("pedido.creado"), at("pedido.cancelado")), (Some(c), Some(x)) if x < c)
        })
        .count() as u64;
    ledger.fault = format!(
        "{INSTANCES} instances on the queue; creating orders {} took {} ms to apply",
        listed(&slow),
        SLOW_FOR.as_millis()
    );
    Ok(ledger)
}

/// One instance: applies what it is handed, slowly for the slow orders' creation, and
/// acknowledges each after applying it, until every event is applied.
async fn consume(
    db: &Db,
    sub: &mut dyn Subscription,
    slow: &std::collections::HashSet<String>,
    expected: usize,
    deadline: Instant,
) -> anyhow::Result<()> {
    while Instant::now() < deadline {
        let done: Option<(i64,)> = db
            .fetch_optional(query("SELECT COUNT(*) FROM lab_order_events"))
            .await?;
        if done.is_some_and(|(n,)| usize::try_from(n).unwrap_or(0) >= expected) {
            break;
        }
        for record in sub.poll(1, Duration::from_millis(100)).await? {
            let event = Envelope::parse(&record.payload).context("the lab's own event")?;
            let order = event.data["id"].as_str().unwrap_or_default().to_owned();
            if event.kind == "pedido.creado" && slow.contains(&order) {
                tokio::time::sleep(SLOW_FOR).await;
            }
            db.execute(
                query("INSERT INTO lab_order_events (order_id, tipo) VALUES ($1, $2)")
                    .bind(&order)
                    .bind(&event.kind),
            )
            .await?;
            sub.commit(&[(record.partition, record.offset + 1)]).await?;
        }
    }
    Ok(())
}
