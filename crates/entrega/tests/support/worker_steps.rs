//! Shared steps of the worker tests.

use std::sync::Arc;
use std::time::Duration;

use entrega::{Backoff, CancellationToken, Router, Worker, WorkerConfig, WorkerError, WorkerStats};
use entrega_core::{Publisher, Record, SystemClock};
use entrega_testkit::{wait_until, LogFixture};
use tokio::task::JoinHandle;

use super::{all_records, event_message, Env, BACKENDS};

pub const TOPIC: &str = "pedidos.eventos";
pub const DLQ: &str = "pedidos.eventos.dlq";
pub const GROUP: &str = "inventario";
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn config() -> WorkerConfig {
    let mut config = WorkerConfig::new(GROUP, TOPIC);
    config.backoff =
        Backoff::new(Duration::from_millis(10), Duration::from_millis(40)).with_jitter(0.0);
    config.poll_wait = Duration::from_millis(50);
    config
}

pub struct Running {
    pub token: CancellationToken,
    pub handle: JoinHandle<Result<(), WorkerError>>,
    pub stats: Arc<WorkerStats>,
}

impl Running {
    pub fn start(log: &dyn LogFixture, publisher: Arc<dyn Publisher>, router: Router) -> Self {
        Self::start_with(log, publisher, router, config())
    }

    pub fn start_with(
        log: &dyn LogFixture,
        publisher: Arc<dyn Publisher>,
        router: Router,
        config: WorkerConfig,
    ) -> Self {
        let worker =
            Worker::new(log.subscriber(), publisher, router, config).with_admin(log.admin());
        let stats = worker.stats();
        let token = CancellationToken::new();
        let run_token = token.clone();
        let handle = tokio::spawn(async move { worker.run(run_token).await });
        Self {
            token,
            handle,
            stats,
        }
    }

    pub async fn stop(self) {
        self.token.cancel();
        self.handle.await.expect("worker task").expect("worker run");
    }
}

pub async fn setup(partitions: u32) -> Vec<Env> {
    let mut envs = Vec::new();
    for backend in BACKENDS {
        let env = Env::new(backend, Arc::new(SystemClock)).await;
        env.log
            .admin()
            .ensure_topic(TOPIC, partitions)
            .await
            .expect("topic");
        envs.push(env);
    }
    envs
}

pub async fn publish(env: &Env, key: &str, tipo: &str, ns: std::ops::Range<u32>) -> Vec<String> {
    let mut ids = Vec::new();
    for n in ns {
        let (envelope, message) = event_message(TOPIC, key, tipo, n);
        env.log
            .publisher()
            .publish(&[message])
            .await
            .expect("publish");
        ids.push(envelope.id.to_string());
    }
    ids
}

/// Every partition with records has its offset committed up to the end.
pub async fn caught_up(log: &dyn LogFixture) -> bool {
    let ends: Vec<(u32, i64)> = log
        .end_offsets(TOPIC)
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, e)| *e > 0)
        .collect();
    log.committed(GROUP, TOPIC).await.unwrap() == ends
}

pub async fn wait_caught_up(env: &Env) {
    let log = env.log.as_ref();
    assert!(
        wait_until(PATIENCE, || caught_up(log)).await,
        "{:?}: offsets not committed to the end",
        env.backend
    );
}

pub async fn dead_letters(env: &Env) -> Vec<Record> {
    if env
        .log
        .end_offsets(DLQ)
        .await
        .unwrap_or_default()
        .is_empty()
    {
        return Vec::new();
    }
    all_records(env.log.as_ref(), DLQ).await
}

pub fn header<'a>(r: &'a Record, name: &str) -> &'a str {
    r.headers.get(name).unwrap_or_default()
}
