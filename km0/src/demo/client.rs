//! Placing the demo's orders through the real HTTP API, several in flight at once.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt as _;
use indicatif::ProgressBar;
use reqwest::StatusCode;

use crate::services::pedidos::NewOrder;

/// Attempts per order before it counts as failed.
const ATTEMPTS: u32 = 6;

/// Longest pause between placing an order and its customer's cancel.
const CANCEL_WITHIN_MS: u64 = 400;

/// How the orders went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placed {
    /// Orders stored.
    pub accepted: u64,
    /// Orders refused, or never answered after every attempt.
    pub failed: u64,
    /// Cancels the API took (202: the saga compensates).
    pub cancels_taken: u64,
    /// Cancels refused as too late (409).
    pub cancels_too_late: u64,
}

/// What one order's requests got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Failed,
    Placed,
    PlacedThenCancelled,
    PlacedCancelTooLate,
}

/// POSTs every order to `addr` with at most `concurrency` in flight; the orders whose
/// entry in `cancel` is true are cancelled by their customer a moment later (a pause
/// that differs from order to order, so some cancels race each step).
pub async fn place_all(
    addr: SocketAddr,
    orders: &[NewOrder],
    cancel: &[bool],
    concurrency: usize,
    progress: &ProgressBar,
) -> Placed {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default();
    let url = format!("http://{addr}/pedidos");
    let outcomes: Vec<Outcome> = futures::stream::iter(orders.iter().enumerate())
        .map(|(n, order)| {
            let (client, url) = (&client, &url);
            let cancels = cancel.get(n).copied().unwrap_or(false);
            async move {
                let placed = place(client, url, order).await;
                progress.inc(1);
                match (placed, cancels) {
                    (false, _) => Outcome::Failed,
                    (true, false) => Outcome::Placed,
                    (true, true) => {
                        let pause = (n as u64).wrapping_mul(37) % CANCEL_WITHIN_MS;
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        match cancel_order(client, url, &order.id).await {
                            true => Outcome::PlacedThenCancelled,
                            false => Outcome::PlacedCancelTooLate,
                        }
                    }
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let count = |o: Outcome| outcomes.iter().filter(|x| **x == o).count() as u64;
    let failed = count(Outcome::Failed);
    Placed {
        accepted: outcomes.len() as u64 - failed,
        failed,
        cancels_taken: count(Outcome::PlacedThenCancelled),
        cancels_too_late: count(Outcome::PlacedCancelTooLate),
    }
}

/// The customer's cancel, retried on transient failures: `true` when taken (202), `false`
/// when it was too late (409: charged with its courier asked for, or paid) or the API never
/// took it.
async fn cancel_order(client: &reqwest::Client, orders_url: &str, id: &str) -> bool {
    let url = format!("{orders_url}/{id}/cancelacion");
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        match client.post(&url).send().await {
            Ok(response) if response.status() == StatusCode::ACCEPTED => return true,
            Ok(response) if response.status() == StatusCode::CONFLICT => return false,
            Ok(response) if response.status().is_server_error() => {
                tracing::warn!(order = %id, status = %response.status(), "cancel not taken yet, retrying");
            }
            Ok(response) => {
                tracing::error!(order = %id, status = %response.status(), "cancel refused");
                return false;
            }
            Err(e) => tracing::warn!(order = %id, error = %e, "cancel failed, retrying"),
        }
    }
    false
}

/// One order, retried on transient failures with a growing pause.
async fn place(client: &reqwest::Client, url: &str, order: &NewOrder) -> bool {
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        match client.post(url).json(order).send().await {
            Ok(response) => match response.status() {
                StatusCode::CREATED => return true,
                // An earlier attempt was stored but its answer was lost.
                StatusCode::CONFLICT if attempt > 0 => return true,
                status if status.is_server_error() => {
                    tracing::warn!(order = %order.id, %status, "order not stored yet, retrying");
                }
                status => {
                    let body = response.text().await.unwrap_or_default();
                    tracing::error!(order = %order.id, %status, %body, "order refused");
                    return false;
                }
            },
            Err(e) => tracing::warn!(order = %order.id, error = %e, "request failed, retrying"),
        }
    }
    false
}
