//! analitica's exactly-once, with real processes on an Apache Kafka node of the test's own:
//! `km0 run pedidos` and `km0 run relay` feed `pedidos.eventos`; `km0 run analitica` turns
//! it into sales per market on `analitica.ventas` inside Kafka transactions.
//!
//! analitica dies twice: first at the failpoint between its records being acknowledged
//! inside the open transaction and the commit (exit 137, as kill -9), then by SIGKILL at a
//! moment of the stream's choosing. Each time it is started again with the same instance name,
//! so the same transactional id, which aborts what the dead process left open.
//!
//! Asserted on the output, read with clients of the test's own:
//! - a `read_committed` reader sees every accepted order counted exactly once, and the totals
//!   are the orders' units and value;
//! - a `read_uncommitted` reader sees more: the aborted transaction's records reached the
//!   broker, so the kill did land mid-transaction and the transactions are what hid them.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::kafka_state::orders::{all_accepted, Load, Placed};
use common::kafka_state::KafkaRig;
use common::state::eventually;
use entrega_core::failpoint::KAFKA_TRANSFORM_BEFORE_COMMIT;
use entrega_core::Envelope;
use km0::services::analitica::{MarketSales, GROUP, MARKET_SALES, OUTPUT_TOPIC};
use km0::services::pedidos::TOPIC;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::ClientConfig;

/// How fast orders are placed.
const PER_SECOND: u32 = 40;
/// Orders placed in each phase.
const PHASE: usize = 120;
/// Unit price of every order line the tests place (`common::state::order`).
const PRICE_CENTS: i64 = 150;
const INSTANCE: &str = "analitica-1";

/// The `ventas.mercado` payloads of `analitica.ventas` as a reader at `isolation` sees them.
fn sales(bootstrap: &str, isolation: &str) -> Vec<MarketSales> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("test-reader-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("reader");
    consumer.subscribe(&[OUTPUT_TOPIC]).expect("subscribe");
    let (started, mut quiet_since) = (Instant::now(), Instant::now());
    let mut out = Vec::new();
    while quiet_since.elapsed() < Duration::from_secs(3)
        && started.elapsed() < Duration::from_secs(60)
    {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let envelope = Envelope::parse(m.payload().unwrap_or_default()).expect("envelope");
                assert_eq!(envelope.kind, MARKET_SALES);
                out.push(serde_json::from_value(envelope.data).expect("ventas.mercado"));
                quiet_since = Instant::now();
            }
            Some(Err(e)) => panic!("reading {OUTPUT_TOPIC}: {e}"),
            None => {}
        }
    }
    out
}

/// How often each order was counted.
fn counts(sales: &[MarketSales]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for s in sales {
        for order in &s.orders {
            *counts.entry(order.clone()).or_default() += 1;
        }
    }
    counts
}

async fn place(rig: &KafkaRig, addr: std::net::SocketAddr, prefix: &str) -> Vec<Placed> {
    let load = Load::start(
        addr,
        rig.state.pedidos.clone(),
        prefix,
        PER_SECOND,
        PHASE,
        7,
    );
    all_accepted(&load.finish().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analitica_killed_mid_transaction_counts_each_order_once() {
    let rig = KafkaRig::start().await;
    let pedidos = rig.deployment.start("pedidos", "pedidos-1").await;
    let _relay = rig.deployment.start("relay", "relay-1").await;

    // 1. Dies inside its first transaction, its records already on the broker.
    let failpoint = format!("{KAFKA_TRANSFORM_BEFORE_COMMIT}=exit");
    let mut first = rig.deployment.spawn("analitica", INSTANCE, &failpoint);
    first.wait_ready().await;
    let mut placed = place(&rig, pedidos.http_addr(), "P-AN1").await;
    first.died_at_failpoint().await;

    // 2. Started again with the same transactional id, then killed in the middle of a stream
    //    it is keeping up with.
    let second = rig.deployment.start("analitica", INSTANCE).await;
    let phase_one: i64 = rig.view.ends(TOPIC).await.values().sum();
    let load = Load::start(
        pedidos.http_addr(),
        rig.state.pedidos.clone(),
        "P-AN2",
        PER_SECOND,
        PHASE,
        8,
    );
    eventually(
        Duration::from_secs(60),
        "the restarted analitica to commit records of the live stream",
        || async {
            let committed: i64 = rig.view.committed(GROUP, TOPIC).await.values().sum();
            (committed > phase_one + 20).then_some(())
        },
    )
    .await;
    second.kill().await;
    placed.extend(all_accepted(&load.finish().await));

    // 3. Once more, to the end.
    let mut third = rig.deployment.start("analitica", INSTANCE).await;
    let bootstrap = rig.broker.bootstrap();
    eventually(
        Duration::from_secs(90),
        "analitica to commit up to the end of pedidos.eventos",
        || async {
            (rig.state.pending().await == 0 && rig.view.caught_up(GROUP, TOPIC).await).then_some(())
        },
    )
    .await;

    let committed = sales(&bootstrap, "read_committed");
    let seen = counts(&committed);
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "orders counted more than once: {twice:?}");
    let missing: Vec<&str> = placed
        .iter()
        .map(|p| p.order_id.as_str())
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "orders never counted: {missing:?}");
    assert_eq!(
        seen.len(),
        placed.len(),
        "counted orders that were never placed"
    );
    let units: i64 = placed
        .iter()
        .flat_map(|p| p.lines.iter().map(|(_, n)| *n))
        .sum();
    assert_eq!(committed.iter().map(|s| s.units).sum::<i64>(), units);
    assert_eq!(
        committed.iter().map(|s| s.amount_cents).sum::<i64>(),
        units * PRICE_CENTS
    );

    let uncommitted = sales(&bootstrap, "read_uncommitted");
    let raw = counts(&uncommitted);
    assert!(
        raw.values().any(|n| *n > 1),
        "no order appears twice to a read_uncommitted reader: the aborted transactions' \
         records never reached the broker, so the kills proved nothing"
    );
    third.assert_running();
    eprintln!(
        "{} orders, {} committed ventas.mercado records, {} in the log with the aborted ones",
        placed.len(),
        committed.len(),
        uncommitted.len()
    );
    rig.deployment.destroy().await;
}
