//! The broker itself dies, with real processes: `km0 run pedidos`, `km0 run relay` and three
//! `km0 run inventario` work on an Apache Kafka node of the test's own while orders stream in
//! over HTTP, each followed by its `pedido.pagado`. The test kills the broker with SIGKILL
//! while the relay is publishing (no shutdown, no flush of its own), keeps placing orders for
//! a while, then restarts the broker on the same log dir.
//!
//! Asserted afterwards, on the databases and on the log read with a client of the test's own:
//!
//! - every outbox row the relay had marked published when the broker died is in the log after
//!   the restart: nothing was marked without the broker's confirmation;
//! - orders were accepted during the outage (the outbox grew), and the relay drained them;
//! - every order applied exactly once, each order's events in enqueue order, each partition in
//!   offset order (`common::kafka_state::checks`), and no km0 process died.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::kafka_state::checks::{assert_applied_exactly_once_in_order, wait_settled};
use common::kafka_state::orders::{all_accepted, Load};
use common::kafka_state::{marked_published, KafkaRig};
use common::process::Km0;
use common::state::eventually;
use km0::services::inventario::GROUP;
use km0::services::pedidos::TOPIC;

/// How fast orders are placed (two events each).
const PER_SECOND: u32 = 40;
/// How long the broker stays dead.
const DEAD_FOR: Duration = Duration::from_secs(8);
/// Orders answered after the restart before the stream ends.
const AFTER_RESTART: usize = 200;
/// Longest wait for everything to be published and consumed once the stream ends.
const SETTLE: Duration = Duration::from_secs(120);
const MEMBERS: [&str; 3] = ["inventario-a", "inventario-b", "inventario-c"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_while_the_relay_publishes_loses_nothing_and_applies_once() {
    let KafkaRig {
        mut broker,
        deployment,
        state,
        view,
        start,
    } = KafkaRig::start().await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay = deployment.start("relay", "relay-1").await;
    let mut members = deployment.start_each("inventario", &MEMBERS).await;
    let load = Load::start(
        pedidos.http_addr(),
        state.pedidos.clone(),
        "P-BK",
        PER_SECOND,
        usize::MAX,
        0x6b_6d30_6b69,
    );
    eventually(
        Duration::from_secs(60),
        "records consumed on every partition",
        || async {
            let committed = view.committed(GROUP, TOPIC).await;
            (committed.len() == 6 && committed.values().all(|c| *c > 0)).then_some(())
        },
    )
    .await;

    // The relay publishes all the time at this rate: the kill lands between a publish and
    // its confirmation, or between the confirmation and the mark.
    broker.kill();
    let killed_at = Instant::now();
    let marked_at_kill = marked_published(&state.pedidos).await;
    let answered_at_kill = load.answered();
    tokio::time::sleep(DEAD_FOR).await;
    let pending_while_dead = state.pending().await;
    let answered_while_dead = load.answered() - answered_at_kill;
    broker.restart();
    eprintln!(
        "broker dead for {:?}: {answered_while_dead} orders accepted meanwhile, \
         {pending_while_dead} events waiting in the outbox",
        killed_at.elapsed()
    );
    assert!(
        answered_while_dead > 0 && pending_while_dead > 0,
        "orders must be accepted while the broker is dead, their events kept in the outbox \
         ({answered_while_dead} answered, {pending_while_dead} pending)"
    );

    load.wait_answered(load.answered() + AFTER_RESTART, Duration::from_secs(60))
        .await;
    let outcomes = load.stop().await;
    let placed = all_accepted(&outcomes);
    wait_settled(&state, &view, SETTLE, "every order published and consumed").await;
    eprintln!(
        "outbox drained and the topic consumed {:?} after the kill",
        killed_at.elapsed()
    );

    let logged: HashSet<String> = view
        .records(TOPIC)
        .await
        .into_iter()
        .filter_map(|r| r.id_evento)
        .collect();
    let lost: Vec<&String> = marked_at_kill.difference(&logged).collect();
    assert!(
        lost.is_empty(),
        "{} of {} rows marked published when the broker died are not in the log, e.g. {:?}",
        lost.len(),
        marked_at_kill.len(),
        lost.first()
    );
    relay.assert_running();
    members.iter_mut().for_each(Km0::assert_running);
    assert_applied_exactly_once_in_order(&state, &view, &placed, &start).await;
    deployment.destroy().await;
}
