//! Scenario: a Kafka → Kafka step (analitica's sales from `pedido.creado`) killed mid-batch,
//! on a real Kafka. Both sides read the same orders in batches, write one sale per order to
//! `analitica.ventas` and are killed after writing a batch's sales and before its offsets are
//! committed, once per order the seed picks. The naive step writes with a plain producer and
//! commits the offsets after; the pattern is entrega's `KafkaTransformer`, which analitica runs
//! on: the sales and the offsets in one Kafka transaction. The sales are counted as a
//! `read_committed` reader (analitica's readers) sees them.
//!
//! The pattern's kill lands in `Transform::before_commit`: the batch's sales are written in
//! its open transaction, and the instance is dropped there, as a killed process leaves it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use entrega::Broker;
use entrega_core::{HandlerError, OutgoingMessage, Record};
use entrega_kafka::{KafkaTransformer, Transform, TransformerConfig};
use serde_json::json;
use tokio::sync::Notify;

use super::brokers::{kafka_url, with_broker};
use super::embedded::{event, keys_on, listed, order_ids, picked, unread};
use super::{Ledger, Side, SideRun};

/// Orders each side reads.
const ORDERS: usize = 60;
/// Kills per side.
const KILLS: usize = 3;
/// Most records per batch.
const BATCH: usize = 10;
const INPUT: &str = "pedidos.eventos";
const OUTPUT: &str = "analitica.ventas";
const GROUP: &str = "lab.analitica";
/// How long a side may take before what is left counts as stuck.
const WITHIN: Duration = Duration::from_secs(60);

/// Runs one side under a namespace of its own on the lab's Kafka, removed after.
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let url = kafka_url(&r.brokers, &r.namespace);
    let what = format!("Kafka at {}", r.brokers.kafka);
    with_broker(&url, &what, async |broker| {
        run_on(broker, r)
            .await
            .with_context(|| format!("the {} side", r.side.name()))
    })
    .await
}

async fn run_on(broker: &Broker, r: &SideRun) -> anyhow::Result<Ledger> {
    broker.admin().ensure_topic(INPUT, 1).await?;
    broker.admin().ensure_topic(OUTPUT, 1).await?;
    let orders = order_ids(ORDERS);
    let created: Vec<OutgoingMessage> = orders
        .iter()
        .map(|o| {
            let data = json!({"id": o, "lineas": [{"producto": "tomate-rosa", "cantidad": 1, "precio_centimos": 350}]});
            event(INPUT, "pedido.creado", o, data)
        })
        .collect();
    broker.publisher().publish(&created).await?;
    let doomed = picked(r.seed, &orders, KILLS);
    let kills = match r.side {
        Side::Naive => without_transactions(broker, &doomed)
            .await
            .context("the step without transactions")?,
        Side::Pattern => in_transactions(broker, &doomed)
            .await
            .context("the transformer")?,
    };
    let sold = keys_on(broker, OUTPUT).await.context("reading the sales")?;
    let mut ledger = Ledger::from_effects(&orders, &sold);
    ledger.stuck = unread(broker, GROUP, INPUT)
        .await
        .context("reading the group's offsets")?;
    ledger.fault = format!(
        "processor killed {kills} times after writing a batch's sales, before committing its \
         offsets (batches with orders {})",
        listed(&doomed)
    );
    Ok(ledger)
}

/// The sale of one order, keyed by the order.
fn sale(record: &Record) -> Option<OutgoingMessage> {
    let order = record.key.clone()?;
    Some(event(
        OUTPUT,
        "venta",
        &order,
        json!({"pedido": order, "importe_centimos": 350}),
    ))
}

/// Marks the doomed orders of `batch` not yet killed for; whether the batch dies.
fn dies(batch: &[Record], doomed: &HashSet<String>, killed: &mut HashSet<String>) -> bool {
    let mut dies = false;
    for order in batch.iter().filter_map(|r| r.key.as_deref()) {
        if doomed.contains(order) && killed.insert(order.to_owned()) {
            dies = true;
        }
    }
    dies
}

/// A consumer and a plain producer: the batch's sales, then its offsets; a kill in between
/// leaves the offsets where they were, and the next instance writes the sales again.
async fn without_transactions(broker: &Broker, doomed: &HashSet<String>) -> anyhow::Result<usize> {
    let deadline = Instant::now() + WITHIN;
    let mut killed = HashSet::new();
    let mut kills = 0;
    let mut instance = 0;
    'instances: while Instant::now() < deadline {
        let member = format!("lab-{instance}");
        let mut sub = broker.subscriber().subscribe(GROUP, INPUT, &member).await?;
        while Instant::now() < deadline {
            if unread(broker, GROUP, INPUT).await? == 0 {
                break 'instances;
            }
            let batch = sub.poll(BATCH, Duration::from_millis(200)).await?;
            let Some(last) = batch.last() else { continue };
            let sales: Vec<OutgoingMessage> = batch.iter().filter_map(sale).collect();
            broker.publisher().publish(&sales).await?;
            if dies(&batch, doomed, &mut killed) {
                kills += 1;
                sub.close().await?;
                instance += 1;
                continue 'instances;
            }
            sub.commit(&[(last.partition, last.offset + 1)]).await?;
        }
        sub.close().await?;
        break;
    }
    Ok(kills)
}

/// The lab's sales, one per order; an instance dies in the commit of a batch it dies in.
struct Sales {
    doomed: HashSet<String>,
    killed: Mutex<HashSet<String>>,
    /// Told when a batch dies, its sales written and its transaction open.
    died: Notify,
}

#[async_trait]
impl Transform for Sales {
    async fn transform(&self, batch: &[Record]) -> Result<Vec<OutgoingMessage>, HandlerError> {
        Ok(batch.iter().filter_map(sale).collect())
    }

    async fn before_commit(&self, batch: &[Record]) -> Result<(), HandlerError> {
        let dies = {
            let mut killed = self.killed.lock().unwrap_or_else(|e| e.into_inner());
            dies(batch, &self.doomed, &mut killed)
        };
        if dies {
            // Dead: this instance goes no further, its transaction open.
            self.died.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// entrega's transformer: the sales and the offsets commit together or not at all. A killed
/// instance is dropped with its transaction open; the next one, with the same
/// `transactional.id`, fences it and has the broker abort that transaction.
async fn in_transactions(broker: &Broker, doomed: &HashSet<String>) -> anyhow::Result<usize> {
    let kafka = broker
        .transactions()
        .context("the pipeline scenario needs Kafka")?;
    let sales = Sales {
        doomed: doomed.clone(),
        killed: Mutex::new(HashSet::new()),
        died: Notify::new(),
    };
    let deadline = Instant::now() + WITHIN;
    let mut kills = 0;
    let mut instance = 0;
    while Instant::now() < deadline {
        let config =
            TransformerConfig::new(GROUP, format!("lab-{instance}"), "lab.analitica", &[INPUT])
                .with_max_batch(BATCH);
        let transformer = KafkaTransformer::start(kafka.config(), config).await?;
        let done = async {
            while Instant::now() < deadline {
                match unread(broker, GROUP, INPUT).await {
                    Ok(0) => return,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        };
        tokio::select! {
            ran = transformer.run(&sales, done) => {
                ran?;
                break;
            }
            () = sales.died.notified() => {
                kills += 1;
                instance += 1;
            }
        }
    }
    Ok(kills)
}
