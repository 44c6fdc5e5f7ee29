//! km0 on a three-node Apache Kafka cluster (`common::kafka_cluster`: replication factor 3,
//! `min.insync.replicas` 2, no unclean leader election), given every bootstrap server and no
//! other setting. `km0 run pedidos`, `km0 run relay` and three `km0 run inventario` work while
//! orders stream in over HTTP, each followed by its `pedido.pagado`. The test kills with
//! SIGKILL the node leading most of `pedidos.eventos`' partitions, keeps placing orders,
//! restarts it; then does the same to the active controller.
//!
//! For each kill it prints what it killed, the partitions that node led when it died, and how
//! long until an event of each of those partitions was applied again, as seen from outside
//! (the group's committed offsets), and writes them to
//! `target/km0-measurements/kafka_cluster.json`. What bounds that time: the controller fences a
//! broker that missed heartbeats for `broker.session.timeout.ms` (6 s here, 9 s by Kafka's
//! default) and elects an in-sync follower, and the clients learn the new leader on their next
//! metadata request. The consumers' sessions outlast that fencing (15 s, entrega's default
//! when the URL names several brokers), so no node's death rebalances the group.
//!
//! Asserted afterwards, on the databases and on the log read with a client of the test's own:
//! every outbox row marked published when a node died is in the log; every accepted order is
//! applied exactly once, each order's events in order (`common::kafka_state::checks`); no km0
//! process died.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::kafka_cluster::KafkaCluster;
use common::kafka_state::checks::{assert_applied_exactly_once_in_order, wait_settled};
use common::kafka_state::orders::{all_accepted, fill_stock, Load};
use common::kafka_state::{marked_published, KafkaView, LEASE_TTL_MS};
use common::process::{Deployment, Km0};
use common::state::eventually;
use entrega::Db;
use km0::services::inventario::GROUP;
use km0::services::pedidos::TOPIC;
use serde_json::{json, Value};

/// How fast orders are placed (two events each).
const PER_SECOND: u32 = 40;
/// How long a killed node stays dead.
const DEAD_FOR: Duration = Duration::from_secs(8);
/// Orders answered after a restart before the next step.
const AFTER_RESTART: usize = 100;
/// Longest wait for the partitions a dead node led to move on.
const RECOVER_WITHIN: Duration = Duration::from_secs(60);
/// Longest wait for everything to be published and consumed once the stream ends.
const SETTLE: Duration = Duration::from_secs(120);
const MEMBERS: [&str; 3] = ["inventario-a", "inventario-b", "inventario-c"];

/// What one kill did, and how long the partitions of the dead node took to move on.
struct Kill {
    what: &'static str,
    node: u32,
    led: Vec<u32>,
    marked: HashSet<String>,
    recovered: BTreeMap<u32, Duration>,
    accepted_while_dead: usize,
}

impl Kill {
    fn report(&self) -> Value {
        let slowest = self.recovered.values().max().copied().unwrap_or_default();
        json!({
            "killed": self.what,
            "node": self.node,
            "partitions_led": self.led,
            "first_applied_after_kill_ms": self.recovered.iter()
                .map(|(p, d)| (p.to_string(), d.as_millis()))
                .collect::<BTreeMap<_, _>>(),
            "slowest_partition_ms": slowest.as_millis(),
            "orders_accepted_while_dead": self.accepted_while_dead,
        })
    }
}

/// Kills `node`, which leads `led`, waits until an event of each of those partitions is
/// applied again, keeps it dead for [`DEAD_FOR`], then restarts it.
async fn kill_and_restart(
    cluster: &mut KafkaCluster,
    what: &'static str,
    node: u32,
    view: &KafkaView,
    pedidos: &Db,
    load: &Load,
) -> Kill {
    let led: Vec<u32> = cluster
        .leaders(TOPIC)
        .into_iter()
        .filter(|(_, leader)| *leader == node)
        .map(|(p, _)| p)
        .collect();
    let before = view.committed(GROUP, TOPIC).await;
    let answered_before = load.answered();
    cluster.kill(node);
    let killed_at = Instant::now();
    let marked = marked_published(pedidos).await;
    eprintln!("killed node {node} ({what}), leading partitions {led:?} of {TOPIC}");
    let mut recovered = BTreeMap::new();
    while recovered.len() < led.len() && killed_at.elapsed() < RECOVER_WITHIN {
        // The group's coordinator may have died with the node: asked again until it moved.
        let now = view.try_committed(GROUP, TOPIC).await.unwrap_or_default();
        for p in &led {
            if !recovered.contains_key(p) && now.get(p) > before.get(p) {
                recovered.insert(*p, killed_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("partitions {led:?} applied again after {recovered:?}");
    tokio::time::sleep(DEAD_FOR.saturating_sub(killed_at.elapsed())).await;
    let accepted_while_dead = load.answered() - answered_before;
    cluster.restart(node);
    eprintln!(
        "node {node} restarted {:?} after its kill; {accepted_while_dead} orders accepted meanwhile",
        killed_at.elapsed()
    );
    Kill {
        what,
        node,
        led,
        marked,
        recovered,
        accepted_while_dead,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_and_the_controller_killed_lose_nothing_and_apply_once_in_order() {
    let mut cluster = KafkaCluster::start();
    let url = cluster.url();
    let deployment = Deployment::with_broker("postgres", &url, LEASE_TTL_MS);
    let state = deployment.state().await;
    let view = KafkaView::new(cluster.bootstrap());
    let start = fill_stock(&state).await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay = deployment.start("relay", "relay-1").await;
    let mut members = deployment.start_each("inventario", &MEMBERS).await;
    let load = Load::start(
        pedidos.http_addr(),
        state.pedidos.clone(),
        "P-CL",
        PER_SECOND,
        usize::MAX,
        0x6b_6d30_636c,
    );
    eventually(
        Duration::from_secs(90),
        "records consumed on every partition",
        || async {
            let committed = view.committed(GROUP, TOPIC).await;
            (committed.len() == 6 && committed.values().all(|c| *c > 0)).then_some(())
        },
    )
    .await;

    let (leader, _) = cluster.busiest_leader(TOPIC);
    let first = kill_and_restart(
        &mut cluster,
        "the node leading most partitions",
        leader,
        &view,
        &state.pedidos,
        &load,
    )
    .await;
    load.wait_answered(load.answered() + AFTER_RESTART, Duration::from_secs(60))
        .await;
    let controller = cluster.controller();
    let second = kill_and_restart(
        &mut cluster,
        "the active controller",
        controller,
        &view,
        &state.pedidos,
        &load,
    )
    .await;
    load.wait_answered(load.answered() + AFTER_RESTART, Duration::from_secs(60))
        .await;
    let outcomes = load.stop().await;
    let placed = all_accepted(&outcomes);
    wait_settled(&state, &view, SETTLE, "every order published and consumed").await;
    common::write_measurements(
        "kafka_cluster",
        &json!({
            "orders_per_second": PER_SECOND,
            "orders": placed.len(),
            "broker_session_timeout_ms": 6000,
            "consumer_session_timeout_ms": entrega_kafka::CLUSTER_SESSION_TIMEOUT.as_millis(),
            "kills": [first.report(), second.report()],
        }),
    );

    for kill in [&first, &second] {
        assert!(
            !kill.led.is_empty(),
            "node {} ({}) led no partition of {TOPIC} when it died",
            kill.node,
            kill.what
        );
        assert_eq!(
            kill.recovered.len(),
            kill.led.len(),
            "partitions {:?} led by node {} were not applied again within {RECOVER_WITHIN:?}",
            kill.led,
            kill.node
        );
        assert!(
            kill.accepted_while_dead > 0,
            "no order accepted while {} was dead",
            kill.what
        );
    }
    let logged: HashSet<String> = view
        .records(TOPIC)
        .await
        .into_iter()
        .filter_map(|r| r.id_evento)
        .collect();
    for kill in [&first, &second] {
        let lost: Vec<&String> = kill.marked.difference(&logged).collect();
        assert!(
            lost.is_empty(),
            "{} of {} rows marked published when {} died are not in the log, e.g. {:?}",
            lost.len(),
            kill.marked.len(),
            kill.what,
            lost.first()
        );
    }
    relay.assert_running();
    members.iter_mut().for_each(Km0::assert_running);
    assert_applied_exactly_once_in_order(&state, &view, &placed, &start).await;
    deployment.destroy().await;
}
