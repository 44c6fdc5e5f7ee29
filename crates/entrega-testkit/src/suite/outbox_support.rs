//! Shared steps of the outbox scenarios.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use entrega_core::{now_ms, Holder, LaneLease, ManualClock, NewEvent};
use serde_json::json;

use crate::harness::{BoxError, OutboxFixture, OutboxHarness, Scenario};

pub(crate) const TTL: Duration = Duration::from_secs(10);
pub(crate) const TTL_MS: i64 = 10_000;

pub(crate) type Body<'a> = Pin<Box<dyn Future<Output = Scenario> + Send + 'a>>;

/// A version-1 `pedido` event for `aggregate_id` carrying `n`.
pub fn event(aggregate_id: &str, n: u32) -> NewEvent {
    NewEvent::new("pedido", aggregate_id, "pedido.creado", json!({ "n": n }))
}

pub(crate) async fn run<F>(h: &dyn OutboxHarness, body: F) -> Scenario
where
    F: for<'a> FnOnce(&'a dyn OutboxFixture, ManualClock) -> Body<'a>,
{
    let clock = ManualClock::new(now_ms());
    let fx = h.outbox(Arc::new(clock.clone())).await?;
    let result = body(fx.as_ref(), clock).await;
    let teardown = fx.teardown().await;
    result.and(teardown)
}

/// `name` in its first life (incarnation 1).
pub(crate) fn holder(name: &str) -> Holder {
    Holder::with_incarnation(name, 1)
}

pub(crate) async fn lease_for(
    fx: &dyn OutboxFixture,
    owner: &str,
    lane: u32,
    now: i64,
) -> Result<LaneLease, BoxError> {
    let held = fx.leases().balance(&holder(owner), now, TTL).await?;
    held.into_iter()
        .find(|l| l.lane == lane)
        .ok_or_else(|| format!("{owner} does not hold lane {lane} after balancing alone").into())
}

pub(crate) async fn lane_of_row(fx: &dyn OutboxFixture, e: &NewEvent) -> Result<u32, BoxError> {
    Ok(fx.row(e.id).await?.ok_or("committed row not found")?.lane)
}
