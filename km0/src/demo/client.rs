//! Placing the demo's orders through the real HTTP API, several in flight at once.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt as _;
use indicatif::ProgressBar;
use reqwest::StatusCode;

use crate::services::pedidos::NewOrder;

/// Attempts per order before it counts as failed.
const ATTEMPTS: u32 = 6;

/// How the orders went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placed {
    /// Orders stored.
    pub accepted: u64,
    /// Orders refused, or never answered after every attempt.
    pub failed: u64,
}

/// POSTs every order to `addr` with at most `concurrency` in flight.
pub async fn place_all(
    addr: SocketAddr,
    orders: &[NewOrder],
    concurrency: usize,
    progress: &ProgressBar,
) -> Placed {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default();
    let url = format!("http://{addr}/pedidos");
    let outcomes: Vec<bool> = futures::stream::iter(orders)
        .map(|order| {
            let (client, url) = (&client, &url);
            async move {
                let ok = place(client, url, order).await;
                progress.inc(1);
                ok
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let accepted = outcomes.iter().filter(|ok| **ok).count() as u64;
    Placed {
        accepted,
        failed: outcomes.len() as u64 - accepted,
    }
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
