//! Dead letters are logged as they happen: `km0 run inventario --log-json` dead-letters three
//! orders of a product it does not stock, and its log holds exactly one WARN `dead letter`
//! line for each, naming the record (topic, partition, offset, key) and why, at the offsets
//! the dead-letter topic's records came from.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::process::Deployment;
use common::state::{eventually, foreign_order, order, place};
use km0::services::pedidos::TOPIC;
use km0::wiring::dead_letter_topic;
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dead_letter_is_logged_once_at_warn() {
    let deployment = Deployment::new("sqlite", 1_000);
    let state = deployment.state().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let relay = deployment.start("relay", "relay-1").await;
    for n in 0..3 {
        place(
            pedidos.http_addr(),
            &order(&format!("P-DL-{n}"), &[("trufa-negra", 1)]),
        )
        .await;
    }
    let mut inventario =
        deployment.spawn_with("inventario", "inventario-1", "", &["--log-json".to_owned()]);
    inventario.wait_ready().await;
    eventually(SETTLE, "three dead letters", || async {
        (state.records(&dead_letter_topic()).await.len() == 3).then_some(())
    })
    .await;
    let log = inventario.log_path();
    inventario.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;

    let logged: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == "dead letter")
        .collect();
    assert_eq!(logged.len(), 3, "one line per dead letter: {logged:#?}");
    let sources: BTreeSet<(u64, i64)> = state
        .records(TOPIC)
        .await
        .iter()
        .map(|r| (u64::from(r.partition), r.offset))
        .collect();
    let mut seen = BTreeSet::new();
    for line in &logged {
        assert_eq!(line["level"], "WARN", "{line}");
        let f = &line["fields"];
        assert_eq!(f["group"], "inventario", "{line}");
        assert_eq!(f["topic"], TOPIC, "{line}");
        assert!(
            f["key"].as_str().is_some_and(|k| k.starts_with("P-DL-")),
            "{line}"
        );
        assert!(
            f["reason"]
                .as_str()
                .is_some_and(|r| r.contains("trufa-negra")),
            "{line}"
        );
        seen.insert((
            f["partition"].as_u64().unwrap(),
            f["offset"].as_i64().unwrap(),
        ));
    }
    assert_eq!(seen, sources, "each record's dead letter logged once");
    state.close().await;
}

/// A record another producer wrote, whose key and product carry terminal escapes and a
/// right-to-left override, is dead-lettered and logged: the log (text, as an operator tails
/// it) holds none of those characters raw, only their escaped form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_in_a_record_reach_the_log_escaped() {
    let deployment = Deployment::new("sqlite", 1_000);
    let state = deployment.state().await;
    // Started first: it makes the topics.
    let inventario = deployment.start("inventario", "inventario-1").await;
    let broker = deployment.system().broker_log().await.unwrap();
    let key = "P-\u{1b}[2J-\u{202e}x";
    let product = "queso\u{1b}]0;owned\u{7}-\u{1b}[31mrojo";
    let (_, message) = foreign_order(key, product, 1);
    broker.publisher().publish(&[message]).await.unwrap();
    eventually(SETTLE, "the record dead-lettered", || async {
        (state.records(&dead_letter_topic()).await.len() == 1).then_some(())
    })
    .await;
    let log = inventario.log_path();
    inventario.terminate().await;

    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("dead letter"))
        .unwrap_or_else(|| panic!("a dead letter line in the log:\n{text}"));
    for raw in ['\u{1b}', '\u{7}', '\u{202e}'] {
        assert!(
            !text.contains(raw),
            "{:?} reached the log raw: {line:?}",
            raw
        );
    }
    assert!(line.contains("\\u001b"), "the escape shown escaped: {line}");
    state.close().await;
}
