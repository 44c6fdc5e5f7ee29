//! Stored answers in batches, on SQLite and PostgreSQL (`ENTREGA_TEST_PG`): a batch is
//! applied in one transaction, a request repeated within the batch or seen before gets the
//! stored answer, a request that cannot be named is refused for good; a request whose effect
//! fails rolls the batch back and the others are applied one by one, each once; batches that
//! race on the same keys apply each key once. And a server fed many calls at once hands its
//! handler fewer batches than requests, each request still applied once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use entrega::db::{query, Backend, Db};
use entrega::rpc::{RpcClient, RpcError, RpcHandler, RpcServer, RpcServerConfig, StoredAnswers};
use entrega::{Broker, CancellationToken};
use entrega_core::{MigrationSet, RpcMessage};
use serde_json::{json, Value};
use uuid::Uuid;

use support::authorise::Counting;
use support::pg::FreshDb;
use support::TempDir;

const CONSUMER: &str = "pagos.autorizacion";

fn authorise() -> Counting {
    Counting::new("autorizaciones")
}

/// How a scenario's handler writes a batch none of whose requests was seen before.
#[derive(Clone, Copy)]
enum Writing {
    /// In a transaction, one statement at a time (`AnswerInTx::answer_all_in`).
    InTx,
    /// As statements written with the answers in one round trip (`AnswerInTx::writes_for`).
    Statements,
}

fn authorise_by(writing: Writing) -> Counting {
    Counting {
        as_statements: matches!(writing, Writing::Statements),
        ..authorise()
    }
}

fn request(body: Value) -> RpcMessage {
    RpcMessage {
        correlation_id: Uuid::new_v4().simple().to_string(),
        reply_to: None,
        headers: Default::default(),
        payload: body.to_string().into_bytes(),
        durable: false,
    }
}

fn order(id: &str) -> RpcMessage {
    request(json!({"pedido_id": id, "importe_centimos": 1250}))
}

async fn fresh(backend: Backend, dir: &TempDir) -> FreshDb {
    let fresh = FreshDb::new(backend, dir, "pagos.db").await;
    fresh
        .db
        .migrate(&[MigrationSet::Inbox, MigrationSet::Rpc])
        .await
        .unwrap();
    fresh
        .db
        .execute(query(authorise().create_table()))
        .await
        .unwrap();
    fresh
}

/// Each order's count of applications, and the number of stored answers.
async fn state(db: &Db) -> (Vec<(String, i64)>, i64) {
    let counts: Vec<(String, i64)> = db
        .fetch_all(query(
            "SELECT pedido_id, CAST(veces AS BIGINT) FROM autorizaciones ORDER BY pedido_id",
        ))
        .await
        .unwrap();
    let answers: Option<i64> = db
        .scalar(query("SELECT COUNT(*) FROM entrega_answers"))
        .await
        .unwrap();
    (counts, answers.unwrap_or(0))
}

fn once(ids: &[&str]) -> Vec<(String, i64)> {
    ids.iter().map(|id| ((*id).to_owned(), 1)).collect()
}

async fn a_batch_is_applied_once_with_its_repeats_answered(backend: Backend, writing: Writing) {
    let dir = TempDir::new();
    let store = fresh(backend, &dir).await;
    let db = store.db.clone();
    let handler = StoredAnswers::new(db.clone(), CONSUMER, authorise_by(writing));
    let stats = handler.stats();

    let p1 = order("P-1");
    let first = [
        &p1,
        &order("P-2"),
        &order("P-1"),
        &request(json!({"importe_centimos": 5})),
        &order("P-3"),
    ];
    let answers = handler.answer_batch(&first).await;
    assert_eq!(answers.len(), 5);
    let p1_answer = answers[0].as_ref().unwrap().clone();
    assert_eq!(
        answers[2].as_ref().unwrap(),
        &p1_answer,
        "a repeat within the batch must get the first one's answer"
    );
    let refused = answers[3].as_ref().unwrap_err();
    assert!(!refused.is_transient(), "a request without key: {refused}");
    assert!(answers[1].is_ok() && answers[4].is_ok());
    assert_eq!(state(&db).await, (once(&["P-1", "P-2", "P-3"]), 3));
    assert_eq!(stats.applied.load(Ordering::Relaxed), 3);
    assert_eq!(stats.repeated.load(Ordering::Relaxed), 1);
    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 0);

    // Seen before: first applied as unseen, which storing the answers refutes and rolls
    // back; then the stored answer, read with the batch, and the new one applied.
    assert_eq!(stats.refuted.load(Ordering::Relaxed), 0);
    let answers = handler.answer_batch(&[&order("P-1"), &order("P-4")]).await;
    assert_eq!(answers[0].as_ref().unwrap(), &p1_answer);
    assert!(answers[1].is_ok());
    assert_eq!(state(&db).await, (once(&["P-1", "P-2", "P-3", "P-4"]), 4));
    assert_eq!(stats.repeated.load(Ordering::Relaxed), 2);
    assert_eq!(stats.refuted.load(Ordering::Relaxed), 1);

    // A repeat alone, right after: read first (repeats were seen lately), nothing applied.
    let answers = handler.answer_batch(&[&order("P-4")]).await;
    assert!(answers[0].is_ok());
    assert_eq!(state(&db).await, (once(&["P-1", "P-2", "P-3", "P-4"]), 4));
    assert_eq!(stats.refuted.load(Ordering::Relaxed), 1);
    assert_eq!(stats.repeated.load(Ordering::Relaxed), 3);

    // A new one alone: read first once more, which finds no repeat; the next goes unread.
    for id in ["P-5", "P-6"] {
        assert!(handler.answer_batch(&[&order(id)]).await[0].is_ok());
    }
    let all = once(&["P-1", "P-2", "P-3", "P-4", "P-5", "P-6"]);
    assert_eq!(state(&db).await, (all, 6));
    assert_eq!(stats.refuted.load(Ordering::Relaxed), 1);
    assert_eq!(stats.applied.load(Ordering::Relaxed), 6);
    store.finish().await;
}

async fn a_failed_effect_undoes_only_itself(backend: Backend, writing: Writing) {
    let dir = TempDir::new();
    let store = fresh(backend, &dir).await;
    let db = store.db.clone();
    let handler = StoredAnswers::new(db.clone(), CONSUMER, authorise_by(writing));
    let stats = handler.stats();
    let bad = request(json!({"pedido_id": "P-6", "falla": true}));
    let answers = handler
        .answer_batch(&[&order("P-5"), &bad, &order("P-7")])
        .await;
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    let failed = answers[1].as_ref().unwrap_err();
    assert!(failed.to_string().contains("tarjeta bloqueada"), "{failed}");
    assert!(!failed.is_transient());
    // P-6's row was written and must be gone with its failure; no answer stored for it.
    assert_eq!(state(&db).await, (once(&["P-5", "P-7"]), 2));
    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 1);
    assert_eq!(stats.applied.load(Ordering::Relaxed), 2);
    store.finish().await;
}

async fn racing_batches_apply_each_key_once(backend: Backend, writing: Writing) {
    let dir = TempDir::new();
    let store = fresh(backend, &dir).await;
    let db = store.db.clone();
    let handler = Arc::new(StoredAnswers::new(
        db.clone(),
        CONSUMER,
        authorise_by(writing),
    ));
    let ids: Vec<String> = (0..12).map(|n| format!("R-{n}")).collect();
    let batch = |reverse: bool| {
        let mut requests: Vec<RpcMessage> = ids
            .iter()
            .map(|id| request(json!({"pedido_id": id, "lento": true})))
            .collect();
        if reverse {
            requests.reverse();
        }
        requests
    };
    let (a, b) = (batch(false), batch(true));
    let (ha, hb) = (handler.clone(), handler.clone());
    let (ra, rb) = tokio::join!(
        async move { ha.answer_batch(&a.iter().collect::<Vec<_>>()).await },
        async move { hb.answer_batch(&b.iter().collect::<Vec<_>>()).await },
    );
    let mut answers_b = rb;
    answers_b.reverse();
    for (x, y) in ra.iter().zip(&answers_b) {
        assert_eq!(
            x.as_ref().unwrap(),
            y.as_ref().unwrap(),
            "both batches must get the same answer per key"
        );
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut expected = once(&refs);
    expected.sort();
    assert_eq!(state(&db).await, (expected, 12));
    store.finish().await;
}

/// Many calls at once on the embedded default's log: fewer batches than requests reached
/// the handler, and each request was applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_under_load_answers_in_batches() {
    let dir = TempDir::new();
    let broker_db = Db::connect(&dir.url("broker.db")).await.unwrap();
    broker_db.migrate(&[MigrationSet::Log]).await.unwrap();
    let broker = Broker::log(&broker_db, Duration::from_secs(2));
    let store = fresh(Backend::Sqlite, &dir).await;
    let db = store.db.clone();
    let handler: Arc<dyn RpcHandler> = Arc::new(StoredAnswers::new(
        db.clone(),
        CONSUMER,
        authorise_by(Writing::Statements),
    ));
    let queue = format!("rpc.lotes.{}", Uuid::new_v4().simple());
    let mut config = RpcServerConfig::new(&queue);
    config.lanes = 1;
    let server = RpcServer::new(broker.rpc(3), handler, config);
    let served = server.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await.unwrap() }
    });
    let client = Arc::new(RpcClient::start(broker.rpc(3)).await.unwrap());
    // Until the server declared its queue, a call is refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ping = json!({"pedido_id": "L-ping"}).to_string().into_bytes();
    // Pings that reached the queue: the one answered, and any the client gave up on, which
    // the server may still answer late (from the stored answer).
    let mut pings = 1;
    while let Err(e) = client
        .call(&queue, ping.clone(), Duration::from_secs(2))
        .await
    {
        assert!(std::time::Instant::now() < deadline, "never served: {e}");
        if matches!(e, RpcError::Timeout { .. }) {
            pings += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Counted from once every ping sent has been answered.
    while served.answered() < pings {
        assert!(
            std::time::Instant::now() < deadline,
            "pings never all answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (answered_before, batches_before) = (served.answered(), served.batches());
    let calls: Vec<_> = (0..200)
        .map(|n| {
            let (client, queue) = (client.clone(), queue.clone());
            tokio::spawn(async move {
                let body = json!({"pedido_id": format!("L-{n}")})
                    .to_string()
                    .into_bytes();
                client
                    .call(&queue, body, Duration::from_secs(30))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for call in calls {
        let reply: Value = serde_json::from_slice(&call.await.unwrap()).unwrap();
        assert_eq!(reply["autorizado"], true);
    }
    let (counts, answers) = state(&db).await;
    assert_eq!(counts.len(), 201);
    assert!(
        counts.iter().all(|(_, n)| *n == 1),
        "applied twice: {counts:?}"
    );
    assert_eq!(answers, 201);
    let answered = served.answered() - answered_before;
    let batches = served.batches() - batches_before;
    assert_eq!(answered, 200);
    assert!(
        batches < 200,
        "{batches} batches for 200 requests: none was grouped"
    );
    stop.cancel();
    task.await.unwrap();
    store.finish().await;
    broker_db.close().await;
}

/// The scenarios on one backend, written each way.
macro_rules! scenarios {
    ($name:ident, $backend:expr, $writing:expr) => {
        mod $name {
            use entrega::db::Backend;

            use super::Writing;

            #[tokio::test]
            async fn a_batch_is_applied_once_with_its_repeats_answered() {
                super::a_batch_is_applied_once_with_its_repeats_answered($backend, $writing).await;
            }

            #[tokio::test]
            async fn a_failed_effect_undoes_only_itself() {
                super::a_failed_effect_undoes_only_itself($backend, $writing).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn racing_batches_apply_each_key_once() {
                super::racing_batches_apply_each_key_once($backend, $writing).await;
            }
        }
    };
}

scenarios!(sqlite, Backend::Sqlite, Writing::InTx);
scenarios!(postgres, Backend::Postgres, Writing::InTx);
scenarios!(sqlite_statements, Backend::Sqlite, Writing::Statements);
scenarios!(postgres_statements, Backend::Postgres, Writing::Statements);

/// A server says when its request queue is open: a call sent from then on is taken at the
/// first try, however soon after the server started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_server_says_its_queue_is_open_the_first_call_is_taken() {
    let dir = TempDir::new();
    let broker_db = Db::connect(&dir.url("broker.db")).await.unwrap();
    broker_db.migrate(&[MigrationSet::Log]).await.unwrap();
    let broker = Broker::log(&broker_db, Duration::from_secs(2));
    let store = fresh(Backend::Sqlite, &dir).await;
    let handler: Arc<dyn RpcHandler> = Arc::new(StoredAnswers::new(
        store.db.clone(),
        CONSUMER,
        authorise_by(Writing::Statements),
    ));
    let queue = format!("rpc.abierta.{}", Uuid::new_v4().simple());
    let server = RpcServer::new(broker.rpc(3), handler, RpcServerConfig::new(&queue));
    let opened = server.opened();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await.unwrap() }
    });
    tokio::time::timeout(Duration::from_secs(20), opened)
        .await
        .expect("the server never opened its queue");
    let client = RpcClient::start(broker.rpc(3)).await.unwrap();
    let request = json!({"pedido_id": "A-1", "importe_centimos": 100})
        .to_string()
        .into_bytes();
    let answer = client
        .call(&queue, request, Duration::from_secs(10))
        .await
        .expect("the first call is taken");
    assert!(!answer.is_empty());
    stop.cancel();
    task.await.unwrap();
    store.finish().await;
}
