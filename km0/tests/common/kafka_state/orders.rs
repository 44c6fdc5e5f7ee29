//! Orders for the Kafka process tests: placed over HTTP (`pedido.creado` through the outbox),
//! each followed by a `pedido.pagado` of the same order committed to the pedidos outbox as
//! another service would write it, so every order has two events whose order matters.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega::Db;
use entrega_core::NewEvent;
use km0::services::inventario::INITIAL_STOCK;
use km0::services::pedidos::{AGGREGATE, ORDER_CREATED, ORDER_PAID};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::MissedTickBehavior;

use crate::common::state::{order, post_order, DbState};

/// Lines of one order: (product, units).
pub type Lines = Vec<(&'static str, i64)>;

/// Units of each product at the start of a test: no order is ever refused for stock.
pub const START_UNITS: i32 = 1_000_000;

/// An accepted order and its events, in the order they were committed to the outbox.
#[derive(Debug, Clone)]
pub struct Placed {
    /// Order id (`agregado_id`, the Kafka key).
    pub order_id: String,
    /// What it takes from the stock.
    pub lines: Lines,
    /// `(tipo, id_evento)` of each event, in enqueue order.
    pub events: Vec<(&'static str, String)>,
}

impl Placed {
    /// `id_evento` of its `pedido.creado`.
    pub fn created_id(&self) -> &str {
        self.events
            .iter()
            .find(|(kind, _)| *kind == ORDER_CREATED)
            .map(|(_, id)| id.as_str())
            .expect("every placed order has its pedido.creado")
    }
}

/// One to three random products with one to four units each.
pub fn random_lines(rng: &mut StdRng) -> Lines {
    let products: Vec<&'static str> = INITIAL_STOCK.iter().map(|(p, _)| *p).collect();
    let n = rng.gen_range(1..=3);
    products
        .choose_multiple(rng, n)
        .map(|p| (*p, rng.gen_range(1..=4)))
        .collect()
}

/// Sets every product's stock to [`START_UNITS`]; returns the stock as set.
pub async fn fill_stock(state: &DbState) -> std::collections::BTreeMap<String, i64> {
    for (product, _) in INITIAL_STOCK {
        state
            .stock_store()
            .set_units(product, START_UNITS)
            .await
            .expect("set stock");
    }
    state.stock().await
}

/// Asserts that the stock is `start` less the lines of every `placed` order: none applied
/// twice, none lost.
pub async fn assert_stock_less(
    state: &DbState,
    placed: &[Placed],
    start: &std::collections::BTreeMap<String, i64>,
) {
    let mut want = start.clone();
    for order in placed {
        for (product, units) in &order.lines {
            *want.get_mut(*product).expect("known product") -= units;
        }
    }
    assert_eq!(
        state.stock().await,
        want,
        "stock is not the start less the accepted orders: some order was applied twice or lost"
    );
}

/// Places order `order_id` through pedidos at `addr`, then commits its `pedido.pagado` to the
/// outbox of `pedidos_db`. `Err` with the reason when the order was not accepted.
pub async fn place_and_pay(
    addr: SocketAddr,
    pedidos_db: &Db,
    order_id: String,
    lines: Lines,
) -> Result<Placed, String> {
    let body = order(&order_id, &lines);
    let (status, answer) = post_until_admitted(addr, &body).await?;
    if status != 201 {
        return Err(format!("status {status}: {answer}"));
    }
    let created = answer["id_evento"]
        .as_str()
        .ok_or_else(|| format!("no id_evento in {answer}"))?
        .to_owned();
    let paid = NewEvent::new(
        AGGREGATE,
        order_id.clone(),
        ORDER_PAID,
        json!({ "id": order_id, "importe_centimos": 150 }),
    );
    enqueue(pedidos_db, &paid).await;
    Ok(Placed {
        order_id,
        lines,
        events: vec![
            (ORDER_CREATED, created),
            (ORDER_PAID, paid.id.hyphenated().to_string()),
        ],
    })
}

/// How long a client keeps retrying an order the server shed (`503`, not processed).
const SHED_PATIENCE: Duration = Duration::from_secs(60);

/// Posts `body` as a well-behaved client does: a `503` (the server shed the request before
/// handling it, under load from other tests on the machine) is retried after its
/// `Retry-After`, for up to [`SHED_PATIENCE`]; any other answer is returned as it came.
async fn post_until_admitted(
    addr: SocketAddr,
    body: &serde_json::Value,
) -> Result<(u16, serde_json::Value), String> {
    let deadline = Instant::now() + SHED_PATIENCE;
    loop {
        let (status, answer) = post_order(addr, body).await?;
        if status != 503 || Instant::now() >= deadline {
            return Ok((status, answer));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Commits `event` to the outbox in a transaction of its own.
async fn enqueue(db: &Db, event: &NewEvent) {
    let mut tx = db.begin().await.expect("begin");
    tx.enqueue(event).await.expect("enqueue");
    tx.commit().await.expect("commit");
}

/// What became of one order of a [`Load`].
#[derive(Debug)]
pub struct Outcome {
    /// When its request was sent.
    pub sent: Instant,
    /// When the answer came (and its `pedido.pagado` was committed).
    pub answered: Instant,
    /// The order, or why it was not accepted.
    pub result: Result<Placed, String>,
}

/// Orders placed at a steady rate in the background, each request on a task of its own so a
/// slow answer does not slow the rate.
pub struct Load {
    answered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Outcome>>,
}

impl Load {
    /// Places up to `max` orders `<prefix>-<n>` with random lines (from `seed`) at
    /// `per_second` through pedidos at `addr`; `pedidos_db` gets their `pedido.pagado`.
    pub fn start(
        addr: SocketAddr,
        pedidos_db: Db,
        prefix: &str,
        per_second: u32,
        max: usize,
        seed: u64,
    ) -> Self {
        let answered = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let prefix = prefix.to_owned();
        let task = {
            let (answered, stop) = (answered.clone(), stop.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut ticker = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
                ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
                let mut requests = JoinSet::new();
                for n in 0..max {
                    ticker.tick().await;
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let (db, answered) = (pedidos_db.clone(), answered.clone());
                    let (id, lines) = (format!("{prefix}-{n:05}"), random_lines(&mut rng));
                    requests.spawn(async move {
                        let sent = Instant::now();
                        let result = place_and_pay(addr, &db, id, lines).await;
                        answered.fetch_add(1, Ordering::SeqCst);
                        Outcome {
                            sent,
                            answered: Instant::now(),
                            result,
                        }
                    });
                }
                let mut outcomes = Vec::new();
                while let Some(done) = requests.join_next().await {
                    outcomes.push(done.expect("order task"));
                }
                outcomes.sort_by_key(|o| o.sent);
                outcomes
            })
        };
        Self {
            answered,
            stop,
            task,
        }
    }

    /// Orders answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits (bounded by `limit`) until `n` orders have been answered.
    pub async fn wait_answered(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.answered() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} orders answered within {limit:?}",
                self.answered()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops placing orders and returns every outcome once all answers are in, by send time.
    pub async fn stop(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("load task")
    }

    /// Waits for all `max` orders to be placed and answered; every outcome, by send time.
    pub async fn finish(self) -> Vec<Outcome> {
        self.task.await.expect("load task")
    }
}

/// The accepted orders of `outcomes`; fails the test if any order was refused.
pub fn all_accepted(outcomes: &[Outcome]) -> Vec<Placed> {
    let refused: Vec<&String> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err())
        .collect();
    assert!(
        refused.is_empty(),
        "{} of {} orders were not accepted, e.g. {:?}",
        refused.len(),
        outcomes.len(),
        refused.first()
    );
    outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().ok().cloned())
        .collect()
}
