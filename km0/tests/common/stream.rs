//! A stream of orders posted over HTTP while a test injects faults, and the check at the
//! end: every accepted order applied exactly once (its `id_evento` the only kind of key
//! recorded, stock the start less what the accepted orders took), every stored order an
//! accepted one, the outbox drained and nothing dead-lettered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use km0::services::inventario::INITIAL_STOCK;
use km0::wiring::dead_letter_topic;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use entrega::db::query_each;

use super::state::{count, eventually, order, post_order, DbState};

/// Products and units of one order.
pub type Lines = Vec<(&'static str, i64)>;

/// Clients posting at once.
const POSTERS: usize = 4;

/// `n` orders of 1 to 3 products, each with the pause before it (up to `max_pause_ms`), all
/// from `seed`.
fn plan_orders(seed: u64, n: usize, max_pause_ms: u64) -> Vec<(Lines, Duration)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let products: Vec<&'static str> = INITIAL_STOCK.iter().map(|(p, _)| *p).collect();
    (0..n)
        .map(|_| {
            let k = rng.gen_range(1..=3);
            let lines = products
                .choose_multiple(&mut rng, k)
                .map(|p| (*p, rng.gen_range(1..=4)))
                .collect();
            (lines, Duration::from_millis(rng.gen_range(0..max_pause_ms)))
        })
        .collect()
}

/// A stream of planned orders being posted while a test injects faults.
pub struct Posting {
    /// The plan: each order's lines and the pause before it.
    pub orders: Arc<Vec<(Lines, Duration)>>,
    answered: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Vec<Option<String>>>,
}

impl Posting {
    /// Starts posting `n` orders planned from `seed` (pauses up to `max_pause_ms`) to the
    /// pedidos at `addr`, with ids `<prefix>-NNNN`.
    pub fn start(
        addr: std::net::SocketAddr,
        prefix: &'static str,
        seed: u64,
        n: usize,
        max_pause_ms: u64,
    ) -> Self {
        let orders = Arc::new(plan_orders(seed, n, max_pause_ms));
        let answered = Arc::new(AtomicUsize::new(0));
        let task = post_all(addr, prefix, orders.clone(), answered.clone());
        Self {
            orders,
            answered,
            task,
        }
    }

    /// Orders answered so far, accepted or not.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` orders are answered, failing after `within`.
    pub async fn answered_at_least(&self, n: usize, within: Duration) {
        eventually(within, "orders answered", || async {
            (self.answered() >= n).then_some(())
        })
        .await;
    }

    /// Waits for every order to be answered; per order, its `id_evento` when accepted.
    pub async fn accepted(self) -> Vec<Option<String>> {
        self.task.await.expect("posting orders")
    }
}

/// Posts every order (ids `<prefix>-NNNN`) from several clients; returns per order its
/// `id_evento` when it was accepted. `answered` counts the answers so far (accepted or not).
fn post_all(
    addr: std::net::SocketAddr,
    prefix: &'static str,
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
                    // Spreads the stream over time, so faults land while orders keep coming.
                    tokio::time::sleep(*pause).await;
                    let body = order(&format!("{prefix}-{i:04}"), lines);
                    if let Ok((201, answer)) = post_order(addr, &body).await {
                        let id = answer["id_evento"].as_str().map(str::to_owned);
                        accepted.lock().unwrap_or_else(|e| e.into_inner())[i] = id;
                    }
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for poster in posters {
            poster.await.expect("poster");
        }
        let accepted = accepted.lock().unwrap_or_else(|e| e.into_inner()).clone();
        accepted
    })
}

/// Waits until the outbox is drained and the consumer has committed every record, then
/// checks the run against `orders` (ids `<prefix>-NNNN`), `accepted` per order and the
/// `start` stock: every accepted order is stored; every stored order (an answer lost to a
/// fault may leave one stored that was not answered 201) was applied exactly once, and no
/// other; stock is the start less the stored orders; the outbox is drained; nothing was
/// dead-lettered. `label` names the run in failures (a seed, a backend).
pub async fn assert_applied_once(
    state: &DbState,
    prefix: &str,
    orders: &[(Lines, Duration)],
    accepted: &[Option<String>],
    start: &BTreeMap<String, i64>,
    settle: Duration,
    label: &str,
) {
    // Outbox drained, then every record of the log committed: all that will ever be applied
    // is applied (in this order, or a record appended in between could be missed).
    eventually(
        settle,
        "every accepted order published and consumed",
        || async { (state.pending().await == 0 && state.consumer_caught_up().await).then_some(()) },
    )
    .await;
    let stored: Vec<(String, String)> = state
        .pedidos
        .fetch_all(query_each(
            "SELECT agregado_id, id FROM outbox WHERE tipo = 'pedido.creado'",
            "SELECT agregado_id, id::text FROM outbox WHERE tipo = 'pedido.creado'",
        ))
        .await
        .expect("stored order events");
    let stored_ids: BTreeSet<String> = stored.iter().map(|(_, id)| id.clone()).collect();
    let answered: BTreeSet<String> = accepted.iter().flatten().cloned().collect();
    let unstored: Vec<_> = answered.difference(&stored_ids).collect();
    assert!(
        unstored.is_empty(),
        "{label}: {} orders answered 201 but not stored (e.g. {:?})",
        unstored.len(),
        unstored.first()
    );
    let keys: BTreeSet<String> = state.keys().await.into_iter().collect();
    let missing: Vec<_> = stored_ids.difference(&keys).collect();
    let unknown: Vec<_> = keys.difference(&stored_ids).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{label}: {} stored orders never applied (e.g. {:?}), {} keys of no stored order \
         (e.g. {:?})",
        missing.len(),
        missing.first(),
        unknown.len(),
        unknown.first()
    );
    let mut want_stock = start.clone();
    for (order_id, _) in &stored {
        let index: usize = order_id
            .strip_prefix(prefix)
            .and_then(|n| n.trim_start_matches('-').parse().ok())
            .unwrap_or_else(|| panic!("{label}: an order of no plan: {order_id}"));
        for (product, quantity) in &orders[index].0 {
            if let Some(units) = want_stock.get_mut(*product) {
                *units -= quantity;
            }
        }
    }
    assert_eq!(
        state.stock().await,
        want_stock,
        "{label}: stock is not the start less the stored orders"
    );
    assert_eq!(
        count(&state.pedidos, "SELECT COUNT(*) FROM pedidos").await,
        i64::try_from(stored.len()).unwrap_or(i64::MAX),
        "{label}: orders stored without their event"
    );
    assert_eq!(state.pending().await, 0, "{label}: outbox not drained");
    assert!(
        state.records(&dead_letter_topic()).await.is_empty(),
        "{label}: orders were dead-lettered"
    );
}
