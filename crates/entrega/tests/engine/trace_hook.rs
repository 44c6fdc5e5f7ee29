//! An application's span-id hook ([`trace::set_span_ids`]) gives a hop its ids: here an
//! answered request, whose handler runs in the context the hook answered (and every event or
//! call it makes carries it). The hook marks the span ids it gives and otherwise answers as
//! entrega would, so the other tests of this binary, which share the process-wide hook, see
//! no difference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::db::Db;
use entrega::rpc::{RpcClient, RpcHandler, RpcServer, RpcServerConfig};
use entrega::{trace, Broker, CancellationToken, HandlerError, Headers, TraceContext};
use entrega_core::{MigrationSet, RpcMessage};
use uuid::Uuid;

use support::TempDir;

const MARK: [u8; 2] = [0xe7, 0x7a];

fn marked(_span: &tracing::Span, parent: Option<TraceContext>) -> Option<TraceContext> {
    let base = parent.map_or_else(TraceContext::root, |p| p.child());
    let mut span_id = base.span_id_bytes();
    span_id[..2].copy_from_slice(&MARK);
    TraceContext::from_ids(base.trace_id_bytes(), span_id, base.flags())
}

/// Answers with the `traceparent` of the context it runs in.
struct Echo;

#[async_trait]
impl RpcHandler for Echo {
    async fn answer(&self, _request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        let ctx = trace::current().expect("the handler runs in the request's context");
        Ok(ctx.header().into_bytes())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_request_runs_in_the_ids_the_hook_gives() {
    // Set once for the whole binary; a second call says so.
    let _ = trace::set_span_ids(marked);
    assert_eq!(trace::set_span_ids(marked), Err(trace::SpanIdsAlreadySet));

    let dir = TempDir::new();
    let broker_db = Db::connect(&dir.url("broker.db")).await.unwrap();
    broker_db.migrate(&[MigrationSet::Log]).await.unwrap();
    let broker = Broker::log(&broker_db, Duration::from_secs(2));
    let queue = format!("rpc.traza.{}", Uuid::new_v4().simple());
    let server = RpcServer::new(broker.rpc(1), Arc::new(Echo), RpcServerConfig::new(&queue));
    let opened = server.opened();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await.unwrap() }
    });
    tokio::time::timeout(Duration::from_secs(20), opened)
        .await
        .expect("the server opened its queue");
    let client = RpcClient::start(broker.rpc(1)).await.unwrap();

    let caller = TraceContext::root();
    let answered = trace::scope(caller, async {
        client
            .call_with(
                &queue,
                Headers::new(),
                b"{}".to_vec(),
                Duration::from_secs(10),
            )
            .await
            .unwrap()
    })
    .await;
    let seen = TraceContext::parse(std::str::from_utf8(&answered.payload).unwrap()).unwrap();
    assert_eq!(
        seen.trace_id(),
        caller.trace_id(),
        "the caller's trace goes on"
    );
    assert_eq!(seen.span_id_bytes()[..2], MARK, "the hook's ids: {seen}");
    assert_ne!(seen.span_id(), caller.span_id());

    stop.cancel();
    task.await.unwrap();
}
