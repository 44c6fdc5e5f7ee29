//! Competing consumers on Kafka, with real processes: `km0 run pedidos`, `km0 run relay` and
//! three `km0 run inventario` in one consumer group on km0's six-partition topic, on an Apache
//! Kafka broker of the test's own and PostgreSQL databases.
//!
//! Orders stream in over HTTP, each followed by its `pedido.pagado`. One consumer is found out
//! and killed:
//!
//! 1. found by its assignment as the group coordinator describes it, then frozen with SIGSTOP
//!    for less than the session timeout: the committed offsets of the partitions it holds
//!    stand still while records keep arriving;
//! 2. let go on with SIGCONT until it has committed past what arrived meanwhile: it applies;
//! 3. killed with SIGKILL while the stream goes on.
//!
//! The survivors must take its partitions over (their committed offsets move again and reach
//! the end, past records appended after the kill, which only a survivor can have applied),
//! and at the end every order is applied exactly once, each partition in offset order
//! (`common::kafka_state::checks`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::kafka_state::checks::{assert_applied_exactly_once_in_order, wait_settled};
use common::kafka_state::orders::{all_accepted, Load};
use common::kafka_state::{KafkaRig, KafkaView};
use common::process::Km0;
use common::state::eventually;
use km0::services::inventario::GROUP;
use km0::services::pedidos::{PARTITIONS, TOPIC};

/// How fast orders are placed: slow enough that two members keep up on a machine running
/// other suites at once (each commit may then take a second), so the survivors' fetched
/// backlog does not hide the dead member's partitions for long.
const PER_SECOND: u32 = 15;
/// Orders placed after the survivors took the dead member's partitions over.
const AFTER_TAKEOVER: usize = 60;
/// How long the victim stays frozen: well within the session timeout, so the group does not
/// notice, and long enough that every partition receives records meanwhile.
const FREEZE: Duration = Duration::from_secs(2);
/// Most freezes tried until every partition the victim holds was seen standing still.
const FREEZE_ATTEMPTS: usize = 12;
/// Longest wait for the survivors to take the dead member's partitions over: the session
/// timeout, a rebalance, then whatever the survivors had fetched before the records of the
/// partitions they were handed.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(90);
/// Longest wait for the victim, let go on, to commit what arrived while it was frozen: on a
/// machine running other suites at once, members wait seconds on each other's stock-row locks.
const CATCH_UP_AFTER_FREEZE: Duration = Duration::from_secs(60);
/// Longest wait for everything to be published and consumed once the stream ends.
const SETTLE: Duration = Duration::from_secs(90);
const MEMBERS: [&str; 3] = ["inventario-a", "inventario-b", "inventario-c"];
const VICTIM: usize = 1;

async fn signal(process: &Km0, name: &str) {
    let status = tokio::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(process.pid().to_string())
        .status()
        .await
        .expect("kill");
    assert!(
        status.success(),
        "could not send SIG{name} to {}",
        process.name
    );
}

/// Partitions with records past their committed offset.
fn behind(ends: &BTreeMap<u32, i64>, committed: &BTreeMap<u32, i64>) -> BTreeSet<u32> {
    ends.iter()
        .filter(|(p, end)| **end > committed.get(p).copied().unwrap_or(0))
        .map(|(p, _)| *p)
        .collect()
}

/// How long the group may take to commit what was in the log, for [`steady`]: on a loaded
/// machine one member may wait a second or two on another's stock-row locks.
const CATCH_UP: Duration = Duration::from_secs(10);

/// `Some` once the group keeps up on every partition: what was in the log when asked is
/// committed within [`CATCH_UP`]. Every partition is held by a member that works.
async fn steady(view: &KafkaView) -> Option<()> {
    let ends = view.ends(TOPIC).await;
    if ends.len() != PARTITIONS as usize || ends.values().any(|end| *end == 0) {
        return None;
    }
    let deadline = Instant::now() + CATCH_UP;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let committed = view.committed(GROUP, TOPIC).await;
        if behind(&ends, &committed).is_empty() {
            return Some(());
        }
    }
    None
}

/// Freezes `victim` for [`FREEZE`]; returns the partitions whose committed offsets stood
/// still meanwhile though records were waiting on them, and the end offsets at the end of
/// the freeze. The victim runs again when this returns.
async fn stalled_while_frozen(
    victim: &Km0,
    view: &KafkaView,
) -> (BTreeSet<u32>, BTreeMap<u32, i64>) {
    signal(victim, "STOP").await;
    // A commit the victim sent just before it stopped may still be landing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = view.committed(GROUP, TOPIC).await;
    tokio::time::sleep(FREEZE).await;
    let after = view.committed(GROUP, TOPIC).await;
    let ends = view.ends(TOPIC).await;
    signal(victim, "CONT").await;
    let stalled = behind(&ends, &after)
        .into_iter()
        .filter(|p| after.get(p) == before.get(p))
        .collect();
    (stalled, ends)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consumers_one_killed_every_order_applied_once_in_order() {
    let KafkaRig {
        broker: _broker,
        deployment,
        state,
        view,
        start,
    } = KafkaRig::start().await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let relay = deployment.start("relay", "relay-1").await;
    let mut members = deployment.start_each("inventario", &MEMBERS).await;
    let load = Load::start(
        pedidos.http_addr(),
        state.pedidos.clone(),
        "P-CC",
        PER_SECOND,
        usize::MAX,
        0x6b6d_3045,
    );
    eventually(
        Duration::from_secs(60),
        "every partition consumed as records arrive",
        || steady(&view),
    )
    .await;
    let partitions = view.ends(TOPIC).await.len();
    assert_eq!(
        partitions, PARTITIONS as usize,
        "km0's topic has its six partitions"
    );

    // 1. Which partitions does the victim hold? The group coordinator says; and frozen, the
    //    victim keeps them: their committed offsets stand still while records arrive (the
    //    others may stall too, waiting on stock rows it locked).
    let victim = members.remove(VICTIM);
    let held = eventually(
        Duration::from_secs(30),
        "the victim to hold some of the topic's partitions",
        || async {
            let held = view.assigned(GROUP, TOPIC, &victim.name).await;
            (!held.is_empty() && held.len() < partitions).then_some(held)
        },
    )
    .await;
    // Each held partition must be seen standing still with records waiting; on a loaded
    // machine the relay publishes in bursts, so one freeze may see records on some of them
    // only: the evidence adds up over freezes.
    let mut stalled = BTreeSet::new();
    let mut ends_after_freeze = BTreeMap::new();
    for _ in 0..FREEZE_ATTEMPTS {
        let (now_stalled, ends) = stalled_while_frozen(&victim, &view).await;
        stalled.extend(now_stalled);
        ends_after_freeze = ends;
        if held.is_subset(&stalled) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        held.is_subset(&stalled),
        "{} holds {held:?}, yet only {stalled:?} stood still while it was frozen",
        victim.name
    );
    // 2. Let go on, it applies and commits what piled up on its partitions.
    eventually(
        CATCH_UP_AFTER_FREEZE,
        "the victim to commit what arrived while it was frozen",
        || async {
            let committed = view.committed(GROUP, TOPIC).await;
            held.iter()
                .all(|p| committed.get(p) >= ends_after_freeze.get(p))
                .then_some(())
        },
    )
    .await;
    // 3. Killed in the middle of the stream.
    let killed_at = Instant::now();
    let victim_name = victim.name.clone();
    victim.kill().await;
    // A commit it sent just before it died may still be landing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_kill = view.committed(GROUP, TOPIC).await;
    let ends_at_kill = view.ends(TOPIC).await;
    eprintln!(
        "{victim_name} held partitions {held:?}; killed after {} orders answered",
        load.answered()
    );

    let taken_over = eventually(
        TAKEOVER_WITHIN,
        "the survivors to commit on the dead member's partitions",
        || async {
            let committed = view.committed(GROUP, TOPIC).await;
            held.iter()
                .all(|p| committed.get(p) > at_kill.get(p))
                .then(|| killed_at.elapsed())
        },
    )
    .await;
    eprintln!("dead member's partitions committed again {taken_over:?} after the kill");
    let answered = load.answered();
    load.wait_answered(answered + AFTER_TAKEOVER, Duration::from_secs(30))
        .await;

    let outcomes = load.stop().await;
    let placed = all_accepted(&outcomes);
    wait_settled(&state, &view, SETTLE, "every order published and consumed").await;
    let ends = view.ends(TOPIC).await;
    let committed = view.committed(GROUP, TOPIC).await;
    for p in &held {
        assert!(
            ends[p] > ends_at_kill[p],
            "no record arrived on partition {p} after the kill; the takeover proves nothing"
        );
        assert_eq!(
            committed.get(p),
            Some(&ends[p]),
            "partition {p} of the dead member was not consumed to its end"
        );
    }
    members.iter_mut().for_each(Km0::assert_running);
    assert_applied_exactly_once_in_order(&state, &view, &placed, &start).await;

    for member in members {
        member.terminate().await;
    }
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}
