//! Crash test (f), chaos: `km0 run pedidos`, `relay` and `inventario` as separate processes,
//! orders posted over HTTP in a stream, and the relay and the consumer killed with SIGKILL at
//! random moments (a bounded number of kills from a seeded RNG), each restarted under a new
//! instance name after the kill. At the end every accepted order is applied exactly once:
//! its `id_evento` is the only kind of key recorded, stock is the start less what the accepted
//! orders took, the outbox is drained and nothing was dead-lettered. On SQLite and PostgreSQL,
//! over the fixed schedule and over fresh random ones each run.
//!
//! `KM0_CHAOS_SEED` replays one schedule; the seeds in use are printed on failure.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use common::process::{Deployment, Km0};
use common::stream::{assert_applied_once, Posting};
use entrega_testkit::wait_until;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DEFAULT_SEED: u64 = 0x6b6d_3043;
/// Order ids are `P-CHAOS-NNNN`.
const PREFIX: &str = "P-CHAOS";
const LEASE_TTL_MS: u64 = 1_000;
/// Longest wait for everything accepted to be consumed once the chaos is over.
const SETTLE: Duration = Duration::from_secs(45);
/// Longest wait for the process about to be killed to have work in hand.
const BUSY_WITHIN: Duration = Duration::from_secs(1);

/// How big a run is: the fixed schedule is long, the random ones shorter.
#[derive(Debug, Clone, Copy)]
struct Size {
    orders: usize,
    kills: usize,
}

const FULL: Size = Size {
    orders: 1200,
    kills: 40,
};
const SHORT: Size = Size {
    orders: 400,
    kills: 12,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Relay,
    Inventario,
}

impl Target {
    fn component(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Inventario => "inventario",
        }
    }
}

/// A SIGKILL once `after_orders` orders have been answered, and the restart after a pause.
/// Orders come faster than a restarted process takes over (one lease period), so kills land
/// in every phase: steady work, waiting for a lease, draining a backlog.
#[derive(Debug)]
struct Kill {
    after_orders: usize,
    target: Target,
    restart_after: Duration,
}

/// The kills of a run, from `seed` (the orders come from the same seed).
fn plan_kills(seed: u64, size: Size) -> Vec<Kill> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6b69_6c6c);
    let mut kills: Vec<Kill> = (0..size.kills)
        .map(|_| Kill {
            after_orders: rng.gen_range(10..size.orders),
            target: if rng.gen_bool(0.5) {
                Target::Relay
            } else {
                Target::Inventario
            },
            restart_after: Duration::from_millis(rng.gen_range(0..300)),
        })
        .collect();
    kills.sort_by_key(|k| k.after_orders);
    kills
}

async fn every_accepted_order_is_applied_exactly_once(backend: &str, seed: u64, size: Size) {
    eprintln!("{backend}: chaos seed {seed} ({size:?})");
    let kills = plan_kills(seed, size);

    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let (state, start) = deployment.stocked_state().await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay: Option<Km0> = Some(deployment.start("relay", "relay-0").await);
    let mut consumer: Option<Km0> = Some(deployment.start("inventario", "inventario-0").await);
    let posting = Posting::start(pedidos.http_addr(), PREFIX, seed, size.orders, 100);

    let mut busy_kills = 0;
    for (k, kill) in kills.iter().enumerate() {
        posting
            .answered_at_least(kill.after_orders, Duration::from_secs(60))
            .await;
        // Aim at a process with work in hand: a kill while idle proves little.
        let busy = wait_until(BUSY_WITHIN, || async {
            match kill.target {
                Target::Relay => state.pending().await > 0,
                Target::Inventario => !state.consumer_caught_up().await,
            }
        })
        .await;
        busy_kills += usize::from(busy);
        let instance = format!("{}-{}", kill.target.component(), k + 1);
        let slot = match kill.target {
            Target::Relay => &mut relay,
            Target::Inventario => &mut consumer,
        };
        slot.take().expect("running").kill().await;
        tokio::time::sleep(kill.restart_after).await;
        *slot = Some(deployment.start(kill.target.component(), &instance).await);
    }
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    let answered_201 = accepted.iter().flatten().count();
    assert!(
        answered_201 >= size.orders * 9 / 10,
        "seed {seed}: only {answered_201} of {} orders accepted",
        size.orders
    );
    assert!(
        busy_kills > 0,
        "seed {seed}: no kill hit a process with work in hand"
    );
    let label = format!("{backend}, seed {seed}");
    assert_applied_once(&state, PREFIX, &orders, &accepted, &start, SETTLE, &label).await;
    eprintln!(
        "{label}: {answered_201} orders accepted, {} records in the log after {} kills \
         ({busy_kills} with work in hand)",
        state.records(km0::services::pedidos::TOPIC).await.len(),
        size.kills
    );

    for process in [consumer, relay].into_iter().flatten() {
        process.terminate().await;
    }
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

/// The fixed schedule, or `KM0_CHAOS_SEED`'s.
fn fixed_seed() -> u64 {
    std::env::var("KM0_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

/// A schedule never run before (printed, so a failure can be replayed).
fn random_seed() -> u64 {
    rand::thread_rng().gen()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_accepted_order_is_applied_exactly_once_through_kills() {
    every_accepted_order_is_applied_exactly_once("sqlite", fixed_seed(), FULL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_accepted_order_is_applied_exactly_once_through_kills() {
    every_accepted_order_is_applied_exactly_once("postgres", fixed_seed(), FULL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_schedules_apply_every_accepted_order_exactly_once() {
    for backend in ["sqlite", "postgres", "sqlite"] {
        every_accepted_order_is_applied_exactly_once(backend, random_seed(), SHORT).await;
    }
}
