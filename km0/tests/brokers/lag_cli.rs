//! `km0 lag` as a process, on the log transport (SQLite) and on an Apache Kafka broker of its own:
//! events are published, a group consumes and commits part of them, and the numbers `km0 lag`
//! prints must be the end and committed offsets read independently of km0 (the log's tables
//! by SQL; Kafka through a plain librdkafka client).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Headers, OutgoingMessage};
use km0::services::inventario::GROUP;
use km0::services::pedidos::{PARTITIONS, TOPIC};
use km0::wiring::config::{DataPlace, Databases};
use km0::wiring::{dead_letter_topic, ensure_topics, System};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::Message as _;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;

use common::kafka_ns::KafkaNamespace;

/// Events published on the orders topic, and dead letters on its dead-letter topic.
const EVENTS: usize = 60;
const DEAD_LETTERS: usize = 3;

/// Where the test reads the truth from, without going through km0.
enum Truth {
    /// The log transport's SQLite database.
    Sqlite(sqlx::SqlitePool),
    /// A Kafka cluster, by its bootstrap servers, and the namespace km0's names are under.
    Kafka { bootstrap: String, prefix: String },
}

impl Truth {
    /// End offset per partition of `topic`.
    async fn ends(&self, topic: &str) -> BTreeMap<u32, i64> {
        match self {
            Self::Sqlite(pool) => {
                rows(
                    pool,
                    "SELECT partition_no, next_offset FROM entrega_partitions WHERE topic = ?1",
                    &[topic],
                )
                .await
            }
            Self::Kafka { bootstrap, prefix } => {
                let (bootstrap, prefix, topic) = (
                    bootstrap.clone(),
                    prefix.clone(),
                    format!("{prefix}{topic}"),
                );
                tokio::task::spawn_blocking(move || kafka_ends(&bootstrap, &prefix, &topic))
                    .await
                    .unwrap()
            }
        }
    }

    /// Committed next offset of `group` per partition of `topic` it committed.
    async fn committed(&self, group: &str, topic: &str) -> BTreeMap<u32, i64> {
        match self {
            Self::Sqlite(pool) => {
                rows(
                    pool,
                    "SELECT partition_no, next_offset FROM entrega_group_offsets
                 WHERE group_id = ?1 AND topic = ?2",
                    &[group, topic],
                )
                .await
            }
            Self::Kafka { bootstrap, prefix } => {
                let (bootstrap, group, topic) = (
                    bootstrap.clone(),
                    format!("{prefix}{group}"),
                    format!("{prefix}{topic}"),
                );
                tokio::task::spawn_blocking(move || kafka_committed(&bootstrap, &group, &topic))
                    .await
                    .unwrap()
            }
        }
    }
}

async fn rows(pool: &sqlx::SqlitePool, sql: &str, binds: &[&str]) -> BTreeMap<u32, i64> {
    let mut query = sqlx::query_as::<_, (i64, i64)>(sql);
    for bind in binds {
        query = query.bind(*bind);
    }
    query
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(p, o)| (u32::try_from(p).unwrap(), o))
        .collect()
}

fn kafka_client(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap()
}

/// The end of each partition of `topic` as the offset after the last record a plain consumer
/// reads from the beginning (the high watermark some Kafka-protocol brokers report stops at
/// the last record batch's base offset).
fn kafka_ends(bootstrap: &str, prefix: &str, topic: &str) -> BTreeMap<u32, i64> {
    let client = kafka_client(bootstrap, &format!("{prefix}lag-test-reader"));
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut ends = BTreeMap::new();
    let mut all = TopicPartitionList::new();
    for p in metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
    {
        all.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
        ends.insert(u32::try_from(p).unwrap(), 0);
    }
    client.assign(&all).unwrap();
    // Read until nothing more arrives for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = Instant::now();
    while last.elapsed() < Duration::from_secs(2) && Instant::now() < deadline {
        if let Some(message) = client.poll(Duration::from_millis(100)) {
            let message = message.unwrap();
            let end = ends
                .entry(u32::try_from(message.partition()).unwrap())
                .or_insert(0);
            *end = (*end).max(message.offset() + 1);
            last = Instant::now();
        }
    }
    ends
}

fn kafka_committed(bootstrap: &str, group: &str, topic: &str) -> BTreeMap<u32, i64> {
    let client = kafka_client(bootstrap, group);
    let mut wanted = TopicPartitionList::new();
    for p in 0..i32::try_from(PARTITIONS).unwrap() {
        wanted.add_partition(topic, p);
    }
    let committed = client
        .committed_offsets(wanted, Duration::from_secs(10))
        .unwrap();
    committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(next) => Some((u32::try_from(e.partition()).unwrap(), next)),
            _ => None,
        })
        .collect()
}

fn message(topic: &str, key: String) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key),
        headers: Headers::new()
            .with(TIPO, "pedido.creado")
            .with(ID_EVENTO, uuid::Uuid::new_v4().to_string()),
        payload: b"{}".to_vec(),
    }
}

/// Runs `km0 --broker <broker_url> lag [extra]` and returns its stdout.
fn km0_lag(dir: &std::path::Path, broker_url: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_km0"))
        // Test deployments migrate as they open (production runs `km0 migrate` first).
        .env("KM0_MIGRATE", "true")
        .arg("--database")
        .arg(format!("sqlite://{}", dir.display()))
        .args(["--broker", broker_url, "lag"])
        .args(extra)
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .output()
        .expect("run km0 lag");
    assert!(
        out.status.success(),
        "km0 lag failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Publishes, consumes part with km0's group, then checks `km0 lag` against `truth`.
async fn lag_is_what_the_broker_holds(broker_url: &str, truth: Truth) {
    let dir = std::env::temp_dir().join(format!("km0-lag-{}", uuid::Uuid::new_v4().simple()));
    let system = System::new(
        Databases::new(DataPlace::SqliteDir(dir.clone())),
        broker_url.to_owned(),
    );
    let broker = system.broker().await.unwrap();
    ensure_topics(&broker).await.unwrap();
    let events: Vec<_> = (0..EVENTS)
        .map(|i| message(TOPIC, format!("P-{i}")))
        .collect();
    broker.publisher().publish(&events).await.unwrap();
    let dead: Vec<_> = (0..DEAD_LETTERS)
        .map(|i| message(&dead_letter_topic(), format!("P-dead-{i}")))
        .collect();
    broker.publisher().publish(&dead).await.unwrap();

    // The only member holds every partition: read everything, then commit half of each even
    // partition and nothing of the odd ones.
    let mut sub = broker
        .subscriber()
        .subscribe(GROUP, TOPIC, "lag-test")
        .await
        .unwrap();
    let mut seen: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.values().map(Vec::len).sum::<usize>() < EVENTS {
        assert!(Instant::now() < deadline, "not every event was delivered");
        for record in sub.poll(100, Duration::from_millis(500)).await.unwrap() {
            seen.entry(record.partition)
                .or_default()
                .push(record.offset);
        }
    }
    let commits: BTreeMap<u32, i64> = seen
        .iter()
        .filter(|(p, _)| *p % 2 == 0)
        .map(|(p, offsets)| (*p, offsets[offsets.len() / 2]))
        .collect();
    sub.commit(&commits.iter().map(|(p, o)| (*p, *o)).collect::<Vec<_>>())
        .await
        .unwrap();
    sub.close().await.unwrap();
    broker.close().await;

    let json: Value = serde_json::from_str(&km0_lag(&dir, broker_url, &["--json"])).unwrap();
    let text = km0_lag(&dir, broker_url, &[]);

    let ends = truth.ends(TOPIC).await;
    let committed = truth.committed(GROUP, TOPIC).await;
    assert_eq!(ends.values().sum::<i64>(), EVENTS as i64);
    assert_eq!(
        committed, commits,
        "the commits made are the commits stored"
    );
    assert!(
        ends.iter()
            .any(|(p, end)| *end > 0 && !committed.contains_key(p)),
        "some partition with records was never committed"
    );

    // Without --group or --topic, every group of km0's components, on the topic it reads.
    let listed: Vec<(String, String)> = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["group"].as_str().unwrap().to_owned(),
                g["topic"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed, km0::ops::lag::km0_groups());
    let group = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == GROUP && g["topic"] == TOPIC)
        .expect("the stock consumer on the orders' topic");
    let rows = group["partitions"].as_array().unwrap();
    assert_eq!(rows.len(), ends.len());
    assert_eq!(ends.len(), PARTITIONS as usize);
    let mut lag_total = 0;
    for row in rows {
        let p = u32::try_from(row["partition"].as_u64().unwrap()).unwrap();
        let end = ends[&p];
        assert_eq!(row["end"].as_i64(), Some(end), "end of partition {p}");
        let from = match committed.get(&p) {
            Some(c) => {
                assert_eq!(row["committed"].as_i64(), Some(*c), "commit of {p}");
                *c
            }
            None => {
                assert!(row["committed"].is_null(), "partition {p}: {row}");
                0
            }
        };
        assert_eq!(row["lag"].as_i64(), Some(end - from), "lag of {p}");
        lag_total += end - from;
        // The table shows the same row, `-` for a partition never committed.
        let shown = committed
            .get(&p)
            .map_or_else(|| "-".to_owned(), i64::to_string);
        let line = format!("{p} {shown} {end} {}", end - from);
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == line),
            "no row `{line}` in:\n{text}"
        );
    }
    assert_eq!(group["lag"].as_i64(), Some(lag_total));
    assert_eq!(group["end"].as_i64(), Some(EVENTS as i64));
    assert_eq!(
        group["committed"].as_i64(),
        Some(committed.values().sum::<i64>())
    );

    let dlq = json["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["topic"] == dead_letter_topic())
        .expect("the orders' dead-letter topic");
    let dlq_ends = truth.ends(&dead_letter_topic()).await;
    assert_eq!(dlq_ends.values().sum::<i64>(), DEAD_LETTERS as i64);
    assert_eq!(dlq["end"].as_i64(), Some(DEAD_LETTERS as i64));

    // Asking for another group: nothing committed anywhere, lag is every record.
    let other: Value = serde_json::from_str(&km0_lag(
        &dir,
        broker_url,
        &["--json", "--group", "nobody", "--topic", TOPIC],
    ))
    .unwrap();
    assert_eq!(other["groups"][0]["group"], "nobody");
    assert_eq!(other["groups"][0]["lag"].as_i64(), Some(EVENTS as i64));
    assert_eq!(other["groups"][0]["committed"].as_i64(), Some(0));

    if let Truth::Sqlite(pool) = truth {
        pool.close().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn lag_on_the_sqlite_log() {
    let dir = std::env::temp_dir().join(format!("km0-lag-db-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broker.db");
    let url = format!("sqlite://{}", file.display());
    // Migrate through km0 first, then read the same file with a pool of the test's own.
    System::new(
        Databases::new(DataPlace::SqliteDir(dir.clone())),
        url.clone(),
    )
    .broker()
    .await
    .unwrap()
    .close()
    .await;
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    lag_is_what_the_broker_holds(&url, Truth::Sqlite(pool)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn lag_on_kafka() {
    let kafka = KafkaNamespace::new();
    let truth = Truth::Kafka {
        bootstrap: kafka.bootstrap(),
        prefix: kafka.wire(""),
    };
    lag_is_what_the_broker_holds(&kafka.url(), truth).await;
}
