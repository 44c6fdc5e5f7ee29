//! Worker outcomes on the in-memory log and on the SQLite log: ack, dead letter, retry in
//! place, malformed and unknown messages, ignored types, panics, graceful shutdown.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use entrega::{
    Backoff, CancellationToken, Handler, Message, Router, Worker, WorkerConfig, WorkerError,
    WorkerStats,
};
use entrega_core::headers::{ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC};
use entrega_core::{HandlerError, Publisher, Record, SystemClock};
use entrega_testkit::{wait_until, Fault, FlakyPublisher, LogFixture};
use support::handlers::{Scripted, Step};
use support::{all_records, event_message, raw_message, Env, BACKENDS};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

const TOPIC: &str = "pedidos.eventos";
const DLQ: &str = "pedidos.eventos.dlq";
const GROUP: &str = "inventario";
const PATIENCE: Duration = Duration::from_secs(20);

fn config() -> WorkerConfig {
    let mut config = WorkerConfig::new(GROUP, TOPIC);
    config.backoff =
        Backoff::new(Duration::from_millis(10), Duration::from_millis(40)).with_jitter(0.0);
    config.poll_wait = Duration::from_millis(50);
    config
}

struct Running {
    token: CancellationToken,
    handle: JoinHandle<Result<(), WorkerError>>,
    stats: Arc<WorkerStats>,
}

impl Running {
    fn start(log: &dyn LogFixture, publisher: Arc<dyn Publisher>, router: Router) -> Self {
        let worker =
            Worker::new(log.subscriber(), publisher, router, config()).with_admin(log.admin());
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

    async fn stop(self) {
        self.token.cancel();
        self.handle.await.expect("worker task").expect("worker run");
    }
}

async fn setup(partitions: u32) -> Vec<Env> {
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

async fn publish(env: &Env, key: &str, tipo: &str, ns: std::ops::Range<u32>) -> Vec<String> {
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
async fn caught_up(log: &dyn LogFixture) -> bool {
    let ends: Vec<(u32, i64)> = log
        .end_offsets(TOPIC)
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, e)| *e > 0)
        .collect();
    log.committed(GROUP, TOPIC).await.unwrap() == ends
}

async fn wait_caught_up(env: &Env) {
    let log = env.log.as_ref();
    assert!(
        wait_until(PATIENCE, || caught_up(log)).await,
        "{:?}: offsets not committed to the end",
        env.backend
    );
}

async fn dead_letters(env: &Env) -> Vec<Record> {
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

fn header<'a>(r: &'a Record, name: &str) -> &'a str {
    r.headers.get(name).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_commits_offsets() {
    for env in setup(2).await {
        publish(&env, "P-1", "pedido.creado", 0..3).await;
        publish(&env, "P-2", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::ok());
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.acked(), 6, "{:?}", env.backend);
        running.stop().await;
        assert_eq!(handler.applied_ns("P-1"), vec![0, 1, 2]);
        assert_eq!(handler.applied_ns("P-2"), vec![0, 1, 2]);
        assert!(dead_letters(&env).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_goes_to_the_dlq_and_the_offset_advances() {
    for env in setup(1).await {
        let (poison, message) = event_message(TOPIC, "P-1", "pedido.creado", 1);
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        env.log
            .publisher()
            .publish(std::slice::from_ref(&message))
            .await
            .unwrap();
        publish(&env, "P-1", "pedido.creado", 2..3).await;
        let handler = Arc::new(Scripted::new(move |m| {
            if m.envelope.id == poison.id {
                Step::Permanent
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.dead_lettered(), 1);
        running.stop().await;
        assert_eq!(handler.applied_ns("P-1"), vec![0, 2], "{:?}", env.backend);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        let dead = &dlq[0];
        assert_eq!(
            dead.payload, message.payload,
            "the original payload is kept"
        );
        assert_eq!(dead.key.as_deref(), Some("P-1"));
        assert_eq!(header(dead, "motivo"), "permanent: stock insuficiente");
        assert_eq!(header(dead, "intentos"), "1");
        assert_eq!(header(dead, "tipo"), "pedido.creado");
        assert_eq!(header(dead, "id_evento"), poison.id.to_string());
        assert_eq!(header(dead, ORIGIN_TOPIC), TOPIC);
        assert_eq!(header(dead, ORIGIN_PARTITION), "0");
        assert_eq!(header(dead, ORIGIN_OFFSET), "1");
        assert_eq!(header(dead, ORIGIN_GROUP), GROUP);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_then_success_is_applied_once_in_order() {
    for env in setup(1).await {
        let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 1 && m.attempt < 3 {
                Step::Transient
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.retried(), 2);
        running.stop().await;
        assert_eq!(
            handler.attempts_of(&ids[1]),
            vec![1, 2, 3],
            "{:?}",
            env.backend
        );
        assert_eq!(
            handler.attempts_of(&ids[2]).len(),
            1,
            "a later message overtook or repeated"
        );
        assert_eq!(handler.applied_ns("P-1"), vec![0, 1, 2]);
        assert!(dead_letters(&env).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_forever_is_dead_lettered_after_max_attempts() {
    for env in setup(1).await {
        let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 1 {
                Step::Transient
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(
            handler.attempts_of(&ids[1]),
            vec![1, 2, 3],
            "{:?}",
            env.backend
        );
        assert_eq!(handler.applied_ns("P-1"), vec![0, 2]);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(header(&dlq[0], "intentos"), "3");
        assert_eq!(
            header(&dlq[0], "motivo"),
            "transient exhausted after 3 attempts: inventario db restarting"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payloads_go_to_the_dlq() {
    for env in setup(1).await {
        let bad = [
            raw_message(TOPIC, "P-1", b"no es json"),
            raw_message(
                TOPIC,
                "P-1",
                br#"{"tipo":"pedido.creado","version":1,"fecha_ms":1,"origen":"x","datos":{}}"#,
            ),
        ];
        env.log.publisher().publish(&bad).await.unwrap();
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        let handler = Arc::new(Scripted::ok());
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(handler.applied_ns("P-1"), vec![0], "{:?}", env.backend);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 2);
        assert!(
            header(&dlq[0], "motivo").starts_with("malformed json at line 1"),
            "{}",
            header(&dlq[0], "motivo")
        );
        assert_eq!(dlq[0].payload, b"no es json");
        assert_eq!(header(&dlq[1], "motivo"), "missing field `id_evento`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tipo_goes_to_the_dlq_and_ignored_tipo_is_acked() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.desconocido", 0..1).await;
        publish(&env, "P-1", "pedido.visto", 1..2).await;
        publish(&env, "P-1", "pedido.creado", 2..3).await;
        let handler = Arc::new(Scripted::ok());
        let router = Router::new()
            .route("pedido.creado", handler.clone())
            .ignore("pedido.visto");
        let running = Running::start(env.log.as_ref(), env.log.publisher(), router);
        wait_caught_up(&env).await;
        assert_eq!(running.stats.ignored(), 1);
        assert_eq!(running.stats.acked(), 1);
        running.stop().await;
        assert_eq!(
            handler.calls(),
            1,
            "{:?}: only the routed type reaches the handler",
            env.backend
        );
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(
            header(&dlq[0], "motivo"),
            "unknown tipo `pedido.desconocido`"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried() {
    for env in setup(1).await {
        let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 1 && m.attempt == 1 {
                Step::Panic
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.retried(), 1);
        running.stop().await;
        // The batch panicked, so the same attempt ran again alone to find the culprit; that
        // one panicked too and was retried as attempt 2.
        assert_eq!(
            handler.attempts_of(&ids[1]),
            vec![1, 1, 2],
            "{:?}",
            env.backend
        );
        assert_eq!(handler.applied_ns("P-1"), vec![0, 1, 2]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_batch_result_redelivers_the_rest_in_order() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..5).await;
        let handler = Arc::new(Scripted::ok().with_batch_cap(2));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(
            handler.applied_ns("P-1"),
            vec![0, 1, 2, 3, 4],
            "{:?}",
            env.backend
        );
        assert_eq!(
            handler.calls(),
            5,
            "a message was attempted twice: {:?}",
            handler.batches()
        );
        assert!(handler.batches().len() >= 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_waits_for_the_dead_letter_publish() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..2).await;
        let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
        flaky.set(Fault::Unavailable);
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 0 {
                Step::Permanent
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            flaky.clone(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        let stats = running.stats.clone();
        assert!(wait_until(PATIENCE, || async { stats.retried() >= 2 }).await);
        assert!(
            env.log
                .committed(GROUP, TOPIC)
                .await
                .unwrap()
                .iter()
                .all(|(_, o)| *o == 0),
            "{:?}",
            env.backend
        );
        flaky.recover();
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(dead_letters(&env).await.len(), 1);
        assert_eq!(handler.applied_ns("P-1"), vec![1]);
    }
}

/// Holds its first batch until released, to shut the worker down while it is in flight.
struct Gate {
    started: Notify,
    release: Notify,
    inner: Scripted,
}

#[async_trait::async_trait]
impl Handler for Gate {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        self.inner.handle(msg).await
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        self.started.notify_one();
        self.release.notified().await;
        self.inner.handle_batch(msgs).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_and_commits_the_batch_in_flight() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..5).await;
        let gate = Arc::new(Gate {
            started: Notify::new(),
            release: Notify::new(),
            inner: Scripted::ok(),
        });
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", gate.clone()),
        );
        tokio::time::timeout(PATIENCE, gate.started.notified())
            .await
            .expect("batch started");
        running.token.cancel();
        gate.release.notify_one();
        running.handle.await.unwrap().unwrap();
        assert_eq!(
            gate.inner.applied_ns("P-1"),
            vec![0, 1, 2, 3, 4],
            "{:?}",
            env.backend
        );
        assert_eq!(env.log.committed(GROUP, TOPIC).await.unwrap(), vec![(0, 5)]);
    }
}
