//! Shared steps of the per-key concurrency tests: interleaved publishing, record lookup, and a
//! watcher of committed offsets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entrega::{Router, WorkerConfig};
use entrega_core::Record;
use entrega_testkit::LogFixture;
use futures::future::BoxFuture;
use tokio::task::JoinHandle;

use super::observed::Observed;
use super::worker_steps::{config, header, GROUP, TOPIC};
use super::{all_records, event_message, Env};

pub const TIPO: &str = "pedido.creado";

pub fn keyed(n: usize) -> WorkerConfig {
    config().with_key_concurrency(n)
}

pub fn router(handler: Arc<Observed>) -> Router {
    Router::new().route(TIPO, handler)
}

/// Publishes `per_key` messages for each key, round by round (k0 n0, k1 n0, ..., k0 n1, ...),
/// so the keys interleave in every partition. Returns the records as stored.
pub async fn publish_interleaved(env: &Env, keys: &[&str], per_key: u32) -> Vec<Record> {
    publish_runs(env, keys, per_key, 1).await
}

/// Like [`publish_interleaved`], with `run` consecutive messages of a key in each round.
pub async fn publish_runs(env: &Env, keys: &[&str], per_key: u32, run: u32) -> Vec<Record> {
    let mut batch = Vec::new();
    for round in 0..per_key.div_ceil(run) {
        for key in keys {
            for n in (round * run..(round + 1) * run).filter(|n| *n < per_key) {
                batch.push(event_message(TOPIC, key, TIPO, n).1);
            }
        }
    }
    env.log.publisher().publish(&batch).await.unwrap();
    all_records(env.log.as_ref(), TOPIC).await
}

pub fn id_of(record: &Record) -> String {
    header(record, "id_evento").to_owned()
}

pub fn find<'a>(records: &'a [Record], key: &str, n: u64) -> &'a Record {
    records
        .iter()
        .find(|r| {
            let data: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
            r.key.as_deref() == Some(key) && data["datos"]["n"] == n
        })
        .unwrap()
}

/// Watches the committed offsets until stopped and reports every sample where `bad` holds.
/// `bad` gets the committed offset of a partition and is evaluated after reading it, so
/// anything applied before that commit is visible to it.
pub struct Watch {
    stop: Arc<AtomicBool>,
    task: JoinHandle<(usize, Vec<(u32, i64)>)>,
}

impl Watch {
    pub fn start(
        log: Arc<dyn LogFixture>,
        bad: impl Fn(u32, i64) -> BoxFuture<'static, bool> + Send + Sync + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut samples, mut violations) = (0, Vec::new());
            while !flag.load(Ordering::SeqCst) {
                for (partition, next) in log.committed(GROUP, TOPIC).await.unwrap() {
                    samples += 1;
                    if bad(partition, next).await {
                        violations.push((partition, next));
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (samples, violations)
        });
        Self { stop, task }
    }

    pub async fn finish(self) -> (usize, Vec<(u32, i64)>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}
