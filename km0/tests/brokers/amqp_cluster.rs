//! km0 on a three-node RabbitMQ cluster of the test's own (`common::amqp_cluster`), given
//! every node in its URL: its queues are quorum queues, replicated on the three nodes.
//! `km0 run pedidos`, `km0 run relay` and three `km0 run inventario` work while orders stream
//! in over HTTP, each followed by its `pedido.pagado`. The test kills with SIGKILL the node
//! leading most of inventario's shard queues, keeps placing orders, and starts it again.
//!
//! Beside them, an entrega request/reply server and a client call each other in a steady
//! stream (`common::rpc_load`), the client connected to the node that dies, the server to
//! another.
//!
//! It prints what it killed, how long until an order was applied again and what the calls
//! did, and asserts: every accepted order applied exactly once (one key per `pedido.creado`,
//! stock the start less the orders), each order's two events delivered in order to a group of
//! the test's own (`common::delivery_order`: inventario applies only the first), nothing
//! dead-lettered, and no km0 process died: each found a node still running; every call answered with its own reply, timed out or failed,
//! never answered twice, and calls answered while the node was dead and after it came back.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use common::amqp_cluster::RabbitCluster;
use common::amqp_state::{assert_applied_exactly_once, depths};
use common::delivery_order::{assert_delivered_in_key_order, DeliveryLog};
use common::kafka_state::orders::{all_accepted, fill_stock, Load};
use common::process::{Deployment, Km0};
use common::rpc_load::{Outcome, RpcLoad};
use common::state::eventually;
use km0::services::inventario::{GROUP, TOPIC};

/// How fast orders are placed (two events each).
const PER_SECOND: u32 = 40;
/// How long the killed node stays dead.
const DEAD_FOR: Duration = Duration::from_secs(10);
/// Orders answered after the restart before the stream ends.
const AFTER_RESTART: usize = 100;
/// Longest wait for everything to be published and consumed once the stream ends.
const SETTLE: Duration = Duration::from_secs(120);
const MEMBERS: [&str; 3] = ["inventario-a", "inventario-b", "inventario-c"];
/// Relay lane lease.
const LEASE_TTL_MS: u64 = 1_000;

/// Ready messages in inventario's shard queues and in its dead-letter queue.
async fn queued(url: &str) -> (u64, u64) {
    let (shards, dead) = depths(url).await;
    (
        shards.iter().map(|d| d.ready).sum(),
        dead.iter().map(|d| d.ready).sum(),
    )
}

/// The shard queues' names on the broker.
async fn shard_queues(url: &str) -> Vec<String> {
    let broker = entrega::Broker::connect(url, Duration::from_secs(10))
        .await
        .unwrap();
    km0::wiring::name_groups(&broker);
    let names = broker
        .as_amqp()
        .unwrap()
        .group_queues(GROUP, TOPIC)
        .queues();
    broker.close().await;
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_leading_most_queues_killed_loses_nothing_and_applies_once() {
    let cluster = RabbitCluster::start();
    let url = format!("{}&shards=6&reconnect_max_ms=2000", cluster.url());
    let deployment = Deployment::with_broker("postgres", &url, LEASE_TTL_MS);
    let state = deployment.state().await;
    let start = fill_stock(&state).await;
    let delivery_log = DeliveryLog::start(&url).await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay = deployment.start("relay", "relay-1").await;
    let mut members = deployment.start_each("inventario", &MEMBERS).await;
    let load = Load::start(
        pedidos.http_addr(),
        state.pedidos.clone(),
        "P-RC",
        PER_SECOND,
        usize::MAX,
        0x6b_6d30_7263,
    );
    eventually(Duration::from_secs(60), "orders applied", || async {
        (state.keys().await.len() >= 40).then_some(())
    })
    .await;

    let victim = cluster.busiest_leader(&shard_queues(&url).await);
    // Request/reply beside: its client on the node about to die (its reply queue with it),
    // its server on another.
    let rpc_queue = format!("km0-cluster-rpc-{}", uuid::Uuid::new_v4().simple());
    let rpc = RpcLoad::start(
        &cluster.url_from(victim % 3 + 1),
        &cluster.url_from(victim),
        &rpc_queue,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let applied_at_kill = state.keys().await.len();
    let answered_at_kill = load.answered();
    cluster.kill(victim);
    let killed_at = Instant::now();
    eprintln!(
        "killed node {} ({}), the leader of most of inventario's shard queues",
        victim,
        cluster.name(victim)
    );
    let recovered = eventually(
        Duration::from_secs(60),
        "an order applied after the kill",
        || {
            let state = &state;
            async move {
                let applied = state.keys().await.len();
                (applied > applied_at_kill + 5).then(|| killed_at.elapsed())
            }
        },
    )
    .await;
    eprintln!("orders applied again {recovered:?} after the kill");
    tokio::time::sleep(DEAD_FOR.saturating_sub(killed_at.elapsed())).await;
    let answered_while_dead = load.answered() - answered_at_kill;
    cluster.restart(victim);
    let restarted_at = Instant::now();
    eprintln!(
        "node {victim} back {:?} after its kill; {answered_while_dead} orders accepted meanwhile",
        killed_at.elapsed()
    );
    assert!(
        answered_while_dead > 0,
        "no order accepted while a node was dead"
    );

    load.wait_answered(load.answered() + AFTER_RESTART, Duration::from_secs(60))
        .await;
    let outcomes = load.stop().await;
    let calls = rpc.stop().await;
    let first_answer = calls
        .calls
        .iter()
        .find(|(at, o)| *at > killed_at && *o == Outcome::Answered)
        .map(|(at, _)| *at - killed_at);
    eprintln!(
        "request/reply: {} calls, {} answered, {} timed out, {} failed, {} wrong; {} clients \
         (a new one when a reply queue died with its node); {} late replies discarded; the \
         first call answered after the kill was made {first_answer:?} after it",
        calls.calls.len(),
        calls.count(Outcome::Answered),
        calls.count(Outcome::TimedOut),
        calls.count(Outcome::Failed),
        calls.count(Outcome::Wrong),
        calls.clients,
        calls.late_replies,
    );
    let placed = all_accepted(&outcomes);
    eventually(SETTLE, "every order published and applied", || async {
        let (ready, _) = queued(&url).await;
        (state.pending().await == 0 && state.keys().await.len() == placed.len() && ready == 0)
            .then_some(())
    })
    .await;
    eventually(
        SETTLE,
        "every event delivered to the test's group",
        || async { delivery_log.has_all(&placed).then_some(()) },
    )
    .await;
    let deliveries = delivery_log.stop().await;
    relay.assert_running();
    members.iter_mut().for_each(Km0::assert_running);
    assert_applied_exactly_once(&state, &placed, &start).await;
    let again = assert_delivered_in_key_order(&deliveries, &placed);
    eprintln!(
        "the test's group: {} deliveries of {} events, each order's in order; {again} \
         delivered again",
        deliveries.len(),
        placed.len() * 2
    );
    assert_eq!(
        calls.count(Outcome::Wrong),
        0,
        "a call answered with another's reply"
    );
    assert_eq!(
        calls.counted.1,
        u64::try_from(calls.count(Outcome::Answered)).unwrap(),
        "the clients handed out more answers than calls were answered"
    );
    assert!(
        calls.answered_between(killed_at, restarted_at) > 0,
        "no call answered while node {victim} was dead"
    );
    assert!(
        calls.answered_between(restarted_at, Instant::now()) > 0,
        "no call answered after node {victim} came back"
    );
    assert_eq!(queued(&url).await.1, 0, "dead-lettered");
    drop(pedidos);
    deployment.destroy().await;
}
