//! Scenario: the seed's exercise 1 on a real Kafka. pagos reads `pedido.creado` and charges
//! each order at the payment gateway simulator (km0's pasarela, on loopback). The naive side
//! is the exercise's consumer: `enable.auto.commit`, the charge, then the INSERT, no key
//! anywhere. It runs as a process of its own (`km0 lab auto-commit-consumer`, hidden) because
//! its kill must be a real one: a consumer that closes commits what it read. The pattern is
//! the idempotent consumer: the processed-message key and the payment in one transaction,
//! the charge under `Idempotency-Key: cobro-<pedido>`, the offset committed after. Both are
//! killed right after charging each order the seed picks.
//!
//! The naive consumer names itself with a static `group.instance.id`, so a restarted one
//! takes its partition back at once instead of waiting out the dead one's session, and keeps
//! a session of 6 s, the broker's least; its commits are the exercise's own.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use entrega::db::{query, Db, Migration};
use entrega::{Broker, MigrationSet};
use entrega_core::{Envelope, OutgoingMessage, Record, Subscription};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::ClientConfig;
use serde_json::{json, Value};

use super::brokers::{kafka_url, with_broker};
use super::embedded::{event, listed, order_ids, picked, unread};
use super::gateway::Gateway;
use super::{Ledger, Side, SideRun};

/// Orders each side charges.
const ORDERS: usize = 30;
/// Kills per side.
const KILLS: usize = 3;
const TOPIC: &str = "pedidos.eventos";
const GROUP: &str = "pagos";
const CONSUMER: &str = "lab.cobro";
/// How long a side may take before what is left counts as stuck.
const WITHIN: Duration = Duration::from_secs(90);
/// How long the naive consumer waits with nothing new before it stops (and closes, which
/// commits).
const IDLE: Duration = Duration::from_secs(2);
/// The exit status of a killed consumer.
const KILLED: i32 = 137;

/// The exercise's table of payments.
const PAGOS: &[Migration] = &[Migration::same(
    1,
    "the exercise's payments",
    "CREATE TABLE IF NOT EXISTS pagos (
         pedido_id    TEXT NOT NULL,
         importe      INTEGER NOT NULL,
         ref_pasarela TEXT NOT NULL
     );",
)];

/// `km0 lab auto-commit-consumer`: the seed's exercise 1 consumer, run by the lab only.
#[derive(Debug, Args)]
pub struct ConsumerArgs {
    /// Kafka's bootstrap servers.
    #[arg(long)]
    bootstrap: String,
    /// The topic of `pedido.creado`, as named on the cluster.
    #[arg(long)]
    topic: String,
    /// The consumer group, as named on the cluster.
    #[arg(long)]
    group: String,
    /// The gateway's base URL.
    #[arg(long)]
    gateway: String,
    /// The SQLite file of the payments.
    #[arg(long)]
    db: PathBuf,
    /// Dies (exit 137) right after charging this order.
    #[arg(long)]
    die_after: Option<String>,
}

/// Runs one side under a namespace of its own on the lab's Kafka, removed after.
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let url = kafka_url(&r.brokers, &r.namespace);
    let what = format!("Kafka at {}", r.brokers.kafka);
    with_broker(&url, &what, async |broker| {
        let gateway = Gateway::start(&r.dir).await?;
        let result = run_on(broker, &gateway, r).await;
        gateway.stop().await;
        result.with_context(|| format!("the {} side", r.side.name()))
    })
    .await
}

async fn run_on(broker: &Broker, gateway: &Gateway, r: &SideRun) -> anyhow::Result<Ledger> {
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(ORDERS);
    let created: Vec<OutgoingMessage> = orders
        .iter()
        .map(|o| {
            let data = json!({
                "id": o,
                "tarjeta": "tok_ana",
                "lineas": [{"producto": "queso-curado", "cantidad": 1, "precio_centimos": 1250}],
            });
            event(TOPIC, "pedido.creado", o, data)
        })
        .collect();
    broker.publisher().publish(&created).await?;
    let doomed = picked(r.seed, &orders, KILLS);
    let kills = match r.side {
        Side::Naive => exercise(broker, r, &gateway.base, &orders, &doomed).await?,
        Side::Pattern => idempotent(broker, r, &gateway.base, &doomed).await?,
    };
    let mut out = Ledger::from_effects(&orders, &gateway.charges().await?);
    out.stuck = unread(broker, GROUP, TOPIC).await?;
    out.fault = format!(
        "consumer killed {kills} times right after a charge, before its offset was committed \
         (orders {})",
        listed(&doomed)
    );
    Ok(out)
}

/// The exercise's consumer, run as processes: one per life, each killed after charging the
/// next doomed order, the last one left to read to the end.
async fn exercise(
    broker: &Broker,
    r: &SideRun,
    gateway: &str,
    orders: &[String],
    doomed: &HashSet<String>,
) -> anyhow::Result<usize> {
    let km0 = match &r.brokers.km0 {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("finding km0's executable")?,
    };
    let kafka = broker
        .as_kafka()
        .context("the exercise scenario needs Kafka")?
        .config()
        .clone();
    let ns = &kafka.namespace;
    // One life per doomed order, in the order the consumer meets them, then one that reads
    // to the end.
    let lives = orders
        .iter()
        .filter(|o| doomed.contains(*o))
        .map(Some)
        .chain([None]);
    let deadline = Instant::now() + WITHIN;
    let mut kills = 0;
    for death in lives {
        let mut command = tokio::process::Command::new(&km0);
        command
            .args([
                "lab",
                "auto-commit-consumer",
                "--bootstrap",
                &kafka.bootstrap,
            ])
            .args(["--topic", &ns.wire(TOPIC), "--group", &ns.wire(GROUP)])
            .args(["--gateway", gateway])
            .arg("--db")
            .arg(r.dir.join("pagos.db"))
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        if let Some(order) = death {
            command.args(["--die-after", order.as_str()]);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let status = tokio::time::timeout(left, command.status())
            .await
            .context("the exercise's consumer ran out of time")?
            .with_context(|| format!("starting {}", km0.display()))?;
        match status.code() {
            Some(KILLED) => kills += 1,
            Some(0) => break,
            other => bail!("the exercise's consumer ended with {other:?}"),
        }
    }
    Ok(kills)
}

/// `km0 lab auto-commit-consumer`: the exercise's loop, as it was written, in Rust.
pub async fn consumer(args: ConsumerArgs) -> anyhow::Result<()> {
    let db = Db::connect(&format!("sqlite://{}", args.db.display())).await?;
    db.apply_migrations("lab", PAGOS).await?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        .set("enable.auto.commit", "true")
        // As the exercise's rewrite reads: with the default `latest`, a new group would skip
        // the orders already there.
        .set("auto.offset.reset", "earliest")
        .set("group.instance.id", "lab-pagos")
        // The broker's least, so the group is gone soon after the last life.
        .set("session.timeout.ms", "6000")
        .create()?;
    consumer.subscribe(&[&args.topic])?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut idle_since = Instant::now();
    while idle_since.elapsed() < IDLE {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        idle_since = Instant::now();
        let Ok(message) = message else { continue };
        let Ok(event) = Envelope::parse(message.payload().unwrap_or_default()) else {
            continue;
        };
        if event.kind != "pedido.creado" {
            continue;
        }
        let order = event.data["id"].as_str().unwrap_or_default().to_owned();
        let importe = amount(&event.data);
        let reference = charge(&http, &args.gateway, &order, &event.data, importe).await?;
        if args.die_after.as_deref() == Some(order.as_str()) {
            // Killed: no close, no commit of what auto-commit has not sent yet.
            std::process::exit(KILLED);
        }
        db.execute(
            query("INSERT INTO pagos (pedido_id, importe, ref_pasarela) VALUES ($1, $2, $3)")
                .bind(&order)
                .bind(importe)
                .bind(&reference),
        )
        .await?;
    }
    // A clean stop: closing the consumer commits what was read.
    drop(consumer);
    db.close().await;
    Ok(())
}

/// The order's total, in cents.
fn amount(data: &Value) -> i64 {
    data["lineas"].as_array().map_or(0, |lines| {
        lines
            .iter()
            .map(|l| {
                l["cantidad"].as_i64().unwrap_or(0) * l["precio_centimos"].as_i64().unwrap_or(0)
            })
            .sum()
    })
}

/// Charges `order` at the gateway; `key` is the Idempotency-Key (the exercise has none: the
/// gateway demands one, so each call makes a new one, which is no key at all).
async fn charge_with(
    http: &reqwest::Client,
    gateway: &str,
    order: &str,
    data: &Value,
    importe: i64,
    key: &str,
) -> anyhow::Result<String> {
    let body = json!({
        "importe_centimos": importe,
        "referencia": order,
        "tarjeta": data["tarjeta"].as_str().unwrap_or("tok_lab"),
    });
    let answer = http
        .post(format!("{gateway}/cargos"))
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .context("charging at the gateway")?;
    if !answer.status().is_success() {
        bail!("the gateway answered {} to {order}", answer.status());
    }
    let charge: Value = answer.json().await?;
    Ok(charge["id"].as_str().unwrap_or_default().to_owned())
}

async fn charge(
    http: &reqwest::Client,
    gateway: &str,
    order: &str,
    data: &Value,
    importe: i64,
) -> anyhow::Result<String> {
    let key = uuid::Uuid::new_v4().to_string();
    charge_with(http, gateway, order, data, importe, &key).await
}

/// The idempotent consumer: the key and the payment in one transaction, the charge under
/// the order's own key, the offset after the commit. Killed after each doomed charge.
async fn idempotent(
    broker: &Broker,
    r: &SideRun,
    gateway: &str,
    doomed: &HashSet<String>,
) -> anyhow::Result<usize> {
    let db = Db::connect(&format!("sqlite://{}", r.dir.join("pagos.db").display())).await?;
    db.migrate(&[MigrationSet::Inbox]).await?;
    db.apply_migrations("lab", PAGOS).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let result = consume(broker, &db, &http, gateway, doomed).await;
    db.close().await;
    result
}

async fn consume(
    broker: &Broker,
    db: &Db,
    http: &reqwest::Client,
    gateway: &str,
    doomed: &HashSet<String>,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + WITHIN;
    let mut killed = HashSet::new();
    let mut instance = 0;
    'instances: while Instant::now() < deadline {
        let member = format!("lab-{instance}");
        let mut sub = broker.subscriber().subscribe(GROUP, TOPIC, &member).await?;
        while Instant::now() < deadline {
            if unread(broker, GROUP, TOPIC).await? == 0 {
                sub.close().await?;
                break 'instances;
            }
            for record in sub.poll(20, Duration::from_millis(100)).await? {
                let order = record.key.clone().unwrap_or_default();
                let kill = doomed.contains(&order) && killed.insert(order);
                if !pay(db, http, gateway, sub.as_mut(), &record, kill).await? {
                    sub.close().await?;
                    instance += 1;
                    continue 'instances;
                }
            }
        }
        sub.close().await?;
    }
    Ok(killed.len())
}

/// Pays one order; `false` when killed after its charge.
async fn pay(
    db: &Db,
    http: &reqwest::Client,
    gateway: &str,
    sub: &mut dyn Subscription,
    record: &Record,
    kill: bool,
) -> anyhow::Result<bool> {
    let event = Envelope::parse(&record.payload).context("the lab's own event")?;
    let order = event.data["id"].as_str().unwrap_or_default().to_owned();
    let mut tx = db.begin().await?;
    if tx.claim(CONSUMER, &event.id.to_string()).await? {
        let importe = amount(&event.data);
        let key = format!("cobro-{order}");
        let reference = charge_with(http, gateway, &order, &event.data, importe, &key).await?;
        if kill {
            // Killed: the transaction never commits, the offset stays.
            drop(tx);
            return Ok(false);
        }
        tx.execute(
            query("INSERT INTO pagos (pedido_id, importe, ref_pasarela) VALUES ($1, $2, $3)")
                .bind(&order)
                .bind(importe)
                .bind(&reference),
        )
        .await?;
    }
    tx.commit().await?;
    sub.commit(&[(record.partition, record.offset + 1)]).await?;
    Ok(true)
}
