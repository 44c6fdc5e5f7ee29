//! Crash test (f), chaos: `km0 run pedidos`, `relay` and `inventario` as separate processes,
//! orders posted over HTTP in a stream, and the relay and the consumer killed with SIGKILL at
//! random moments (a bounded number of kills from a seeded RNG), each restarted under a new
//! instance name after the kill. At the end every accepted order is applied exactly once:
//! its `id_evento` is the only kind of key recorded, stock is the start less what the accepted
//! orders took, the outbox is drained and nothing was dead-lettered. On SQLite and PostgreSQL.
//!
//! `KM0_CHAOS_SEED` replays another schedule; the seed in use is printed on failure.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::process::{Deployment, Km0};
use common::state::{count, eventually, order, post_order};
use entrega_testkit::wait_until;
use km0::services::inventario::INITIAL_STOCK;
use km0::wiring::dead_letter_topic;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const ORDERS: usize = 1200;
const POSTERS: usize = 4;
const KILLS: usize = 40;
const DEFAULT_SEED: u64 = 0x6b6d_3043;
/// Units of each product at the start: enough that no order is refused for stock.
const START_UNITS: i32 = 100_000;
const LEASE_TTL_MS: u64 = 1_000;
/// Longest wait for everything accepted to be consumed once the chaos is over.
const SETTLE: Duration = Duration::from_secs(45);
/// Longest wait for the process about to be killed to have work in hand.
const BUSY_WITHIN: Duration = Duration::from_secs(1);

type Lines = Vec<(&'static str, i64)>;

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

/// The orders to post (with the pause before each) and the kills, all from `seed`.
fn plan(seed: u64) -> (Vec<(Lines, Duration)>, Vec<Kill>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let products: Vec<&'static str> = INITIAL_STOCK.iter().map(|(p, _)| *p).collect();
    let orders = (0..ORDERS)
        .map(|_| {
            let n = rng.gen_range(1..=3);
            let lines = products
                .choose_multiple(&mut rng, n)
                .map(|p| (*p, rng.gen_range(1..=4)))
                .collect();
            (lines, Duration::from_millis(rng.gen_range(0..100)))
        })
        .collect();
    let mut kills: Vec<Kill> = (0..KILLS)
        .map(|_| Kill {
            after_orders: rng.gen_range(10..ORDERS),
            target: if rng.gen_bool(0.5) {
                Target::Relay
            } else {
                Target::Inventario
            },
            restart_after: Duration::from_millis(rng.gen_range(0..300)),
        })
        .collect();
    kills.sort_by_key(|k| k.after_orders);
    (orders, kills)
}

/// Posts every order from `POSTERS` clients; returns per order its `id_evento` if accepted.
fn post_all(
    addr: std::net::SocketAddr,
    orders: Arc<Vec<(Lines, Duration)>>,
    answered: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<Option<String>>> {
    tokio::spawn(async move {
        let next = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(Mutex::new(vec![None; orders.len()]));
        let mut posters = Vec::new();
        for _ in 0..POSTERS {
            let (next, orders, accepted, answered) = (
                next.clone(),
                orders.clone(),
                accepted.clone(),
                answered.clone(),
            );
            posters.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((lines, pause)) = orders.get(i) else {
                        break;
                    };
                    // Spreads the stream over time, so kills land while orders keep coming.
                    tokio::time::sleep(*pause).await;
                    let body = order(&format!("P-CHAOS-{i:04}"), lines);
                    if let Ok((201, answer)) = post_order(addr, &body).await {
                        let id = answer["id_evento"].as_str().map(str::to_owned);
                        accepted.lock().unwrap()[i] = id;
                    }
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for poster in posters {
            poster.await.unwrap();
        }
        let accepted = accepted.lock().unwrap().clone();
        accepted
    })
}

async fn every_accepted_order_is_applied_exactly_once(backend: &str) {
    let seed = std::env::var("KM0_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("{backend}: chaos seed {seed}");
    let (orders, kills) = plan(seed);
    let orders = Arc::new(orders);

    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    for (product, _) in INITIAL_STOCK {
        state
            .stock_store()
            .set_units(product, START_UNITS)
            .await
            .unwrap();
    }
    let start = state.stock().await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay: Option<Km0> = Some(deployment.start("relay", "relay-0").await);
    let mut consumer: Option<Km0> = Some(deployment.start("inventario", "inventario-0").await);
    let answered = Arc::new(AtomicUsize::new(0));
    let posting = post_all(pedidos.http_addr(), orders.clone(), answered.clone());

    let mut busy_kills = 0;
    for (k, kill) in kills.iter().enumerate() {
        eventually(
            Duration::from_secs(60),
            &format!("{} orders answered", kill.after_orders),
            || async { (answered.load(Ordering::SeqCst) >= kill.after_orders).then_some(()) },
        )
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
    let accepted = posting.await.unwrap();

    let accepted: Vec<(String, &Lines)> = accepted
        .iter()
        .zip(orders.iter())
        .filter_map(|(id, (lines, _))| id.clone().map(|id| (id, lines)))
        .collect();
    assert!(
        accepted.len() >= ORDERS * 9 / 10,
        "seed {seed}: only {} of {ORDERS} orders accepted",
        accepted.len()
    );
    let want_keys: BTreeSet<String> = accepted.iter().map(|(id, _)| id.clone()).collect();
    // Outbox drained, then every record of the log committed: all that will ever be applied
    // is applied (in this order, or a record appended in between could be missed).
    eventually(
        SETTLE,
        "every accepted order published and consumed",
        || async { (state.pending().await == 0 && state.consumer_caught_up().await).then_some(()) },
    )
    .await;

    eprintln!(
        "{backend}: {} orders accepted, {} records in the log after {KILLS} kills \
         ({busy_kills} with work in hand)",
        accepted.len(),
        state.records(km0::services::pedidos::TOPIC).await.len()
    );
    let keys: BTreeSet<String> = state.keys().await.into_iter().collect();
    let missing: Vec<_> = want_keys.difference(&keys).collect();
    let unknown: Vec<_> = keys.difference(&want_keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "seed {seed}: {} accepted orders never applied (e.g. {:?}), {} keys of no accepted \
         order (e.g. {:?})",
        missing.len(),
        missing.first(),
        unknown.len(),
        unknown.first()
    );
    let mut want_stock: BTreeMap<String, i64> = start.clone();
    for (_, lines) in &accepted {
        for (product, quantity) in lines.iter() {
            *want_stock.get_mut(*product).unwrap() -= quantity;
        }
    }
    assert_eq!(
        state.stock().await,
        want_stock,
        "seed {seed}: stock is not the start less the accepted orders"
    );
    assert_eq!(
        count(&state.pedidos, "SELECT COUNT(*) FROM pedidos").await,
        i64::try_from(accepted.len()).unwrap(),
        "seed {seed}: orders stored but not accepted, or accepted but not stored"
    );
    assert_eq!(state.pending().await, 0, "seed {seed}: outbox not drained");
    assert!(
        state.records(&dead_letter_topic()).await.is_empty(),
        "seed {seed}: orders were dead-lettered"
    );

    for process in [consumer, relay].into_iter().flatten() {
        process.terminate().await;
    }
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_accepted_order_is_applied_exactly_once_through_kills() {
    every_accepted_order_is_applied_exactly_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_accepted_order_is_applied_exactly_once_through_kills() {
    every_accepted_order_is_applied_exactly_once("postgres").await;
}
