//! Durable request/reply with real processes, on the embedded default (the log in SQLite) and
//! on RabbitMQ (`ENTREGA_TEST_AMQP`): a child process records requests in its database and
//! runs a `DurableRequester`; the parent serves them slowly, so calls are in flight when it
//! kills the child with SIGKILL. A new child (the same database, the same durable reply
//! queue) then applies every reply exactly once: no request lost, none applied twice, and the
//! server applied each request once by its key.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::query;
use entrega::rpc::{
    DurableConfig, DurableRequester, PendingRequest, ReplyHandler, RpcServer, RpcServerConfig,
    StoredAnswers,
};
use entrega::{Broker, CancellationToken, Db, Tx};
use entrega_core::{now_ms, HandlerError, MigrationSet, RpcMessage, RpcTransport};
use serde_json::{json, Value};
use support::authorise::Counting;
use support::TempDir;

const ROLE: &str = "ENTREGA_RPC_ROLE";
const DIR: &str = "ENTREGA_RPC_DIR";
const BROKER: &str = "ENTREGA_RPC_BROKER";
const QUEUE: &str = "ENTREGA_RPC_QUEUE";
/// Requests the child records.
const REQUESTS: usize = 40;

async fn open(url: &str, sets: &[MigrationSet]) -> Db {
    let db = Db::connect(url).await.unwrap();
    db.migrate(sets).await.unwrap();
    db
}

async fn broker(url: &str) -> Broker {
    if url.starts_with("amqp") {
        return Broker::connect(url, Duration::from_secs(2)).await.unwrap();
    }
    Broker::log(
        &open(url, &[MigrationSet::Log]).await,
        Duration::from_secs(2),
    )
}

/// The server's effect: counts each order's authorisations (applied twice would be 2), slow
/// enough that calls are in flight when the requester dies.
fn authorise() -> Counting {
    Counting {
        delay: Duration::from_millis(60),
        ..Counting::new("servidas")
    }
}

/// The requester's effect: one row per reply applied (applied twice would be 2).
struct Record;

#[async_trait]
impl ReplyHandler for Record {
    async fn apply(
        &self,
        tx: &mut Tx,
        request: &PendingRequest,
        reply: &RpcMessage,
    ) -> Result<(), HandlerError> {
        let body: Value =
            serde_json::from_slice(&reply.payload).map_err(HandlerError::permanent)?;
        assert_eq!(
            body["pedido_id"],
            request.correlation_id.trim_start_matches("autorizacion-")
        );
        tx.execute(
            query(
                "INSERT INTO aplicadas (id_correlacion, veces) VALUES ($1, 1) \
                 ON CONFLICT (id_correlacion) DO UPDATE SET veces = aplicadas.veces + 1",
            )
            .bind(request.correlation_id.clone()),
        )
        .await?;
        Ok(())
    }
}

async fn requester_db(dir: &str) -> Db {
    let db = open(
        &format!("sqlite://{dir}/requester.db"),
        &[MigrationSet::Inbox, MigrationSet::Rpc],
    )
    .await;
    db.execute(query(
        "CREATE TABLE IF NOT EXISTS aplicadas (id_correlacion TEXT PRIMARY KEY, veces BIGINT NOT NULL)",
    ))
    .await
    .unwrap();
    db
}

/// The child side: records the requests (first run) and runs the requester; in the second
/// run, exits 0 once every request is answered. Does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_child() {
    let (Ok(role), Ok(dir), Ok(url), Ok(queue)) = (
        std::env::var(ROLE),
        std::env::var(DIR),
        std::env::var(BROKER),
        std::env::var(QUEUE),
    ) else {
        return;
    };
    let db = requester_db(&dir).await;
    if role == "first" {
        for i in 0..REQUESTS {
            let mut tx = db.begin().await.unwrap();
            let body = json!({"pedido_id": format!("P-{i}"), "importe_centimos": 100 + i});
            tx.request(
                &queue,
                &format!("autorizacion-P-{i}"),
                body.to_string().as_bytes(),
                now_ms() + 120_000,
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    }
    let broker = broker(&url).await;
    let mut config = DurableConfig::new(format!("{queue}.respuestas"));
    config.resend_after = Duration::from_secs(3);
    let requester = DurableRequester::new(db.clone(), broker.rpc(3), Arc::new(Record), config);
    let stop = CancellationToken::new();
    let watch = {
        let (db, stop) = (db.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let open: Option<i64> = db
                    .scalar(query(
                        "SELECT COUNT(*) FROM entrega_requests WHERE state <> 'replied'",
                    ))
                    .await
                    .unwrap();
                if role == "second" && open == Some(0) {
                    stop.cancel();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    requester.run(stop).await.unwrap();
    watch.abort();
    std::process::exit(0);
}

fn child(role: &str, dir: &TempDir, url: &str, queue: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rpc_durable::rpc_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, role)
        .env(DIR, &dir.0)
        .env(BROKER, url)
        .env(QUEUE, queue)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn count(db: &Db, sql: &'static str) -> i64 {
    db.scalar::<i64>(query(sql)).await.unwrap().unwrap_or(0)
}

async fn requester_killed_with_calls_in_flight_applies_every_reply_once(amqp: bool) {
    let dir = TempDir::new();
    let url = if amqp {
        std::env::var("ENTREGA_TEST_AMQP")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
    } else {
        dir.url("broker.db")
    };
    let queue = format!("rpc.durable.{}", uuid::Uuid::new_v4().simple());
    let server_db = open(
        &dir.url("server.db"),
        &[MigrationSet::Inbox, MigrationSet::Rpc],
    )
    .await;
    server_db
        .execute(query(
            "CREATE TABLE servidas (pedido_id TEXT PRIMARY KEY, veces BIGINT NOT NULL)",
        ))
        .await
        .unwrap();
    let transport: Arc<dyn RpcTransport> = broker(&url).await.rpc(3);
    let handler = Arc::new(StoredAnswers::new(
        server_db.clone(),
        "servidor",
        authorise(),
    ));
    let mut config = RpcServerConfig::new(&queue);
    config.concurrency = 2;
    let server = RpcServer::new(transport, handler, config);
    let stop = CancellationToken::new();
    let serving = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await.unwrap() }
    });
    // The request queue exists before the child sends (publishing is mandatory).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let db = requester_db(&dir.0.display().to_string()).await;
    let mut first = child("first", &dir, &url, &queue);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let applied = count(&db, "SELECT COUNT(*) FROM aplicadas").await;
        let sent = count(
            &db,
            "SELECT COUNT(*) FROM entrega_requests WHERE state = 'sent'",
        )
        .await;
        if applied >= 3 && sent >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{applied} applied, {sent} in flight"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await.unwrap();
    let applied_at_kill = count(&db, "SELECT COUNT(*) FROM aplicadas").await;
    assert!(
        applied_at_kill < REQUESTS as i64,
        "every reply was applied before the kill: it hit nothing in flight"
    );

    let mut second = child("second", &dir, &url, &queue);
    let status = tokio::time::timeout(Duration::from_secs(90), second.wait())
        .await
        .expect("the restarted requester finishes")
        .unwrap();
    assert!(status.success(), "{status}");
    stop.cancel();
    serving.await.unwrap();

    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM entrega_requests WHERE state = 'replied'"
        )
        .await,
        REQUESTS as i64
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM aplicadas").await,
        REQUESTS as i64
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM aplicadas WHERE veces <> 1").await,
        0,
        "a reply was applied twice"
    );
    assert_eq!(
        count(&server_db, "SELECT COUNT(*) FROM servidas").await,
        REQUESTS as i64
    );
    assert_eq!(
        count(&server_db, "SELECT COUNT(*) FROM servidas WHERE veces <> 1").await,
        0,
        "a request was applied twice by the server"
    );
    eprintln!("{applied_at_kill} of {REQUESTS} replies applied when the requester was killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requester_killed_with_calls_in_flight_on_the_embedded_default() {
    requester_killed_with_calls_in_flight_applies_every_reply_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requester_killed_with_calls_in_flight_on_rabbitmq() {
    requester_killed_with_calls_in_flight_applies_every_reply_once(true).await;
}
