//! Scenario 7: pagos charging orders at the payment gateway simulator (km0's pasarela, served
//! on loopback over its own SQLite ledger) when some answers are lost after the charge. Both
//! sides retry a charge whose answer never came; the naive client makes a new
//! Idempotency-Key for each attempt, the pattern keeps the one it made first
//! (`cobro-<pedido>`).

use std::collections::HashSet;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use reqwest::StatusCode;
use serde_json::json;

use super::embedded::{listed, order_ids, picked};
use super::gateway::Gateway;
use super::{Ledger, Side, SideRun};

/// Orders charged.
const ORDERS: usize = 30;
/// Charges whose answer is lost.
const HUNG: usize = 3;
/// How long a lost answer is held back: longer than the client waits.
const HANG_MS: u64 = 400;
/// How long the client waits for an answer before it tries again.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// Attempts per charge before the client gives up (the order then counts as lost).
const ATTEMPTS: u32 = 20;

/// Runs one side in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let gateway = Gateway::start(&r.dir).await?;
    let result = run_on(&gateway, r.seed, r.side).await;
    gateway.stop().await;
    result
}

async fn run_on(gateway: &Gateway, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    let hung = charge_all(&gateway.base, seed, side).await?;
    let orders = order_ids(ORDERS);
    let mut out = Ledger::from_effects(&orders, &gateway.charges().await?);
    out.fault = format!(
        "{} charges' answers lost after charging (orders {}); the client waits {} ms, then retries",
        hung.len(),
        listed(&hung),
        CLIENT_TIMEOUT.as_millis()
    );
    Ok(out)
}

/// Charges every order once from the client's point of view; returns the orders whose first
/// answer was lost.
async fn charge_all(base: &str, seed: u64, side: Side) -> anyhow::Result<HashSet<String>> {
    let client = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build()?;
    let orders = order_ids(ORDERS);
    let hung = picked(seed, &orders, HUNG);
    for order in &orders {
        if hung.contains(order) {
            // The next charge is recorded, and its answer held back past the client's wait.
            let faults = json!({"colgar_tras_cobro": 1, "colgar_ms": HANG_MS});
            let set = client
                .put(format!("{base}/fallos"))
                .timeout(Duration::from_secs(5))
                .json(&faults)
                .send()
                .await?;
            if !set.status().is_success() {
                bail!("the gateway refused the lab's faults: {}", set.status());
            }
        }
        charge(&client, base, order, side).await?;
    }
    Ok(hung)
}

/// Charges `order` until an answer comes back: with the same key each attempt (pattern) or a
/// new one (naive).
async fn charge(
    client: &reqwest::Client,
    base: &str,
    order: &str,
    side: Side,
) -> anyhow::Result<()> {
    let body = json!({"importe_centimos": 1250, "referencia": order, "tarjeta": "tok_lab"});
    let stable = format!("cobro-{order}");
    let deadline = Instant::now() + Duration::from_secs(10);
    for attempt in 1..=ATTEMPTS {
        let key = match side {
            Side::Pattern => stable.clone(),
            Side::Naive => format!("{stable}-{}", uuid::Uuid::new_v4().simple()),
        };
        let sent = client
            .post(format!("{base}/cargos"))
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status() == StatusCode::CREATED => return Ok(()),
            // 409: the first attempt under this key still runs; try again shortly.
            Ok(answer) if answer.status() == StatusCode::CONFLICT => {}
            Ok(answer) if answer.status().is_server_error() => {}
            Ok(answer) => bail!("the gateway answered {} to {order}", answer.status()),
            Err(e) if e.is_timeout() || e.is_connect() => {}
            Err(e) => return Err(e).context("charging at the gateway"),
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt.min(4)))).await;
    }
    bail!("{order} got no answer after {ATTEMPTS} attempts")
}
