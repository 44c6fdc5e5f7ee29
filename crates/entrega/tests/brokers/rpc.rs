//! Request/reply on the embedded default (the log in SQLite) and on RabbitMQ
//! (`ENTREGA_TEST_AMQP`): many calls in flight on one client, each matched to its own
//! reply; a call that times out leaves no entry behind and its late reply is counted and
//! dropped; a repeated request (same key, new correlation id) gets the stored answer and no
//! second effect; a permanent failure is answered with an error body; a queue nobody serves
//! is refused; an answer whose requester's queue is gone is counted and dropped, its request
//! acknowledged (on RabbitMQ such an answer goes unconfirmed and comes back later).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::rpc::{
    RpcClient, RpcError, RpcHandler, RpcServer, RpcServerConfig, StoredAnswers, RPC_ERROR,
};
use entrega::{Broker, CancellationToken, Db};
use entrega_core::{HandlerError, MigrationSet, RpcMessage, RpcTransport};
use serde_json::{json, Value};
use support::authorise::Counting;
use support::TempDir;

/// Echoes `{"n": n}` back as `{"n": n, "doble": 2n}` after `sleep_ms` (from the request).
struct Echo;

#[async_trait]
impl RpcHandler for Echo {
    async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        let body: Value =
            serde_json::from_slice(&request.payload).map_err(HandlerError::permanent)?;
        if body.get("fail").is_some() {
            return Err(HandlerError::permanent(std::io::Error::other(
                "tarjeta no válida",
            )));
        }
        let sleep = body["sleep_ms"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(sleep)).await;
        let n = body["n"].as_i64().unwrap_or(-1);
        Ok(json!({"n": n, "doble": 2 * n}).to_string().into_bytes())
    }
}

/// Counts each order's authorisations and answers with the count: applied twice would
/// answer 2.
fn authorise() -> Counting {
    Counting {
        with_count: true,
        ..Counting::new("autorizaciones")
    }
}

/// A broker and, for the log, the database it lives in.
struct Rig {
    broker: Broker,
    _dir: Option<TempDir>,
}

async fn rig(amqp: bool) -> Rig {
    if amqp {
        let url = std::env::var("ENTREGA_TEST_AMQP")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
        return Rig {
            broker: Broker::connect(&url, Duration::from_secs(2)).await.unwrap(),
            _dir: None,
        };
    }
    let dir = TempDir::new();
    let db = Db::connect(&dir.url("broker.db")).await.unwrap();
    db.migrate(&[MigrationSet::Log]).await.unwrap();
    Rig {
        broker: Broker::log(&db, Duration::from_secs(2)),
        _dir: Some(dir),
    }
}

fn queue(what: &str) -> String {
    format!("rpc.{what}.{}", uuid::Uuid::new_v4().simple())
}

fn serve(
    transport: Arc<dyn RpcTransport>,
    handler: Arc<dyn RpcHandler>,
    queue: &str,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let server = RpcServer::new(transport, handler, RpcServerConfig::new(queue));
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await.unwrap() }
    });
    (stop, task)
}

/// Waits until `queue` is served (a call answers).
async fn until_served(client: &RpcClient, queue: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ping = json!({"n": 0}).to_string().into_bytes();
        match client.call(queue, ping, Duration::from_secs(2)).await {
            Ok(_) => return,
            Err(e) => assert!(Instant::now() < deadline, "never served: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn many_calls_in_flight_each_get_their_own_reply(amqp: bool) {
    let rig = rig(amqp).await;
    let transport = rig.broker.rpc(3);
    let q = queue("eco");
    let (stop, task) = serve(transport.clone(), Arc::new(Echo), &q);
    let client = Arc::new(RpcClient::start(transport.clone()).await.unwrap());
    until_served(&client, &q).await;

    // 64 at once, answered in another order than sent (later ones sleep less).
    let calls: Vec<_> = (0..64)
        .map(|n| {
            let (client, q) = (client.clone(), q.clone());
            tokio::spawn(async move {
                let body = json!({"n": n, "sleep_ms": (64 - n) * 2})
                    .to_string()
                    .into_bytes();
                let reply = client
                    .call(&q, body, Duration::from_secs(10))
                    .await
                    .unwrap();
                let reply: Value = serde_json::from_slice(&reply).unwrap();
                (n, reply)
            })
        })
        .collect();
    for call in calls {
        let (n, reply) = call.await.unwrap();
        assert_eq!(reply["n"], n, "a reply went to the wrong call");
        assert_eq!(reply["doble"], 2 * n);
    }
    assert_eq!(client.in_flight(), 0);
    assert_eq!(client.stats().late_replies(), 0);

    // A call that gives up leaves no entry; its reply, when it comes, is counted as late.
    let slow = json!({"n": 7, "sleep_ms": 400}).to_string().into_bytes();
    let outcome = client.call(&q, slow, Duration::from_millis(100)).await;
    assert!(
        matches!(outcome, Err(RpcError::Timeout { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        client.in_flight(),
        0,
        "a timed-out call left its entry behind"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.stats().late_replies() < 1 {
        assert!(Instant::now() < deadline, "the late reply never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(client.stats().timeouts(), 1);
    assert_eq!(client.in_flight(), 0);

    // A permanent failure is answered, with an error body, not left to time out.
    let bad = json!({"fail": true}).to_string().into_bytes();
    let reply = client
        .call_with(&q, Default::default(), bad, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(reply.headers.get(RPC_ERROR), Some("permanent"));
    let body: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("tarjeta no válida"));

    // Nobody serves this queue: refused, not silently lost.
    let nobody = client
        .call(&queue("nadie"), b"{}".to_vec(), Duration::from_secs(2))
        .await;
    assert!(matches!(nobody, Err(RpcError::Send(_))), "{nobody:?}");
    assert_eq!(client.in_flight(), 0);

    stop.cancel();
    task.await.unwrap();
}

async fn a_repeated_request_gets_the_stored_answer(amqp: bool) {
    let rig = rig(amqp).await;
    let dir = TempDir::new();
    let db = Db::connect(&dir.url("pagos.db")).await.unwrap();
    db.migrate(&[MigrationSet::Inbox, MigrationSet::Rpc])
        .await
        .unwrap();
    db.execute(entrega::db::query(authorise().create_table()))
        .await
        .unwrap();
    let handler = Arc::new(StoredAnswers::new(
        db.clone(),
        "pagos.autorizacion",
        authorise(),
    ));
    let stats = handler.stats();
    let transport = rig.broker.rpc(3);
    let q = queue("autorizaciones");
    let (stop, task) = serve(transport.clone(), handler, &q);
    let client = RpcClient::start(transport).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let request = json!({"pedido_id": "P-1", "importe_centimos": 1250})
        .to_string()
        .into_bytes();
    let first = loop {
        match client
            .call(&q, request.clone(), Duration::from_secs(2))
            .await
        {
            Ok(reply) => break reply,
            Err(e) => assert!(Instant::now() < deadline, "never served: {e}"),
        }
    };
    // The caller retries (after a timeout, say): a new correlation id, the same key.
    let again = client
        .call(&q, request.clone(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        again, first,
        "a repeat must get the stored answer unchanged"
    );
    let first: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(first["veces"], 1);
    let veces: Option<i64> = db
        .scalar(entrega::db::query(
            "SELECT CAST(veces AS BIGINT) FROM autorizaciones WHERE pedido_id = 'P-1'",
        ))
        .await
        .unwrap();
    assert_eq!(veces, Some(1), "the request was applied twice");
    assert!(stats.repeated.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    stop.cancel();
    task.await.unwrap();
    db.close().await;
}

async fn an_answer_nobody_takes_is_counted_and_dropped(amqp: bool) {
    let rig = rig(amqp).await;
    let transport = rig.broker.rpc(3);
    let q = queue("huerfana");
    let server = RpcServer::new(transport.clone(), Arc::new(Echo), RpcServerConfig::new(&q));
    let served = server.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await.unwrap() }
    });
    let client = RpcClient::start(transport.clone()).await.unwrap();
    until_served(&client, &q).await;

    // A request whose requester's queue does not exist (it went away with its requester).
    let orphan = RpcMessage {
        correlation_id: "huerfana-1".into(),
        reply_to: Some(queue("nadie")),
        headers: Default::default(),
        payload: json!({"n": 7}).to_string().into_bytes(),
        durable: false,
    };
    transport.send(&q, &orphan, None).await.unwrap();
    // Counted once its answer is known undelivered: at once, or as later batches go out.
    let deadline = Instant::now() + Duration::from_secs(20);
    while served
        .undeliverable
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the lost answer was never counted"
        );
        let body = json!({"n": 1}).to_string().into_bytes();
        client.call(&q, body, Duration::from_secs(5)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its request was acknowledged: not delivered, answered and lost again.
    for n in 0..20 {
        let body = json!({"n": n}).to_string().into_bytes();
        client.call(&q, body, Duration::from_secs(5)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let body = json!({"n": 0}).to_string().into_bytes();
    client.call(&q, body, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        served
            .undeliverable
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    stop.cancel();
    task.await.unwrap();
}

mod embedded {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_nobody_takes_is_counted_and_dropped() {
        super::an_answer_nobody_takes_is_counted_and_dropped(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_calls_in_flight_each_get_their_own_reply() {
        super::many_calls_in_flight_each_get_their_own_reply(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeated_request_gets_the_stored_answer() {
        super::a_repeated_request_gets_the_stored_answer(false).await;
    }
}

mod rabbitmq {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_nobody_takes_is_counted_and_dropped() {
        super::an_answer_nobody_takes_is_counted_and_dropped(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_calls_in_flight_each_get_their_own_reply() {
        super::many_calls_in_flight_each_get_their_own_reply(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeated_request_gets_the_stored_answer() {
        super::a_repeated_request_gets_the_stored_answer(true).await;
    }
}
