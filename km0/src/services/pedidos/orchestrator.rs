//! The order saga's orchestrator as tasks, next to pedidos (it owns the sagas' tables): one
//! worker per topic of answers (`inventario.eventos`, `pagos.eventos`, `reparto.eventos`, as
//! group `pedidos`) applying each answer to its saga, and the saga timers (resends,
//! deadlines, compensations unanswered).

use std::time::Duration;

use anyhow::Context as _;
use entrega::saga::Sagas;
use entrega::{CancellationToken, Handler, Router};
use futures::FutureExt as _;

use crate::services::{inventario, pagos, reparto};
use crate::wiring::{consumer_worker, ensure_topics, run_together, Part, System, Task};

/// The orchestrator's consumer group on the topics of answers.
pub const SAGA_GROUP: &str = "pedidos";
/// Longest wait of the saga timers for a timer set by another process.
const TIMERS_EVERY: Duration = Duration::from_millis(200);

/// The answers each topic carries to the saga; the topic's other events pass.
fn routers(sagas: &Sagas) -> [(&'static str, Router); 3] {
    let handler: std::sync::Arc<dyn Handler> = std::sync::Arc::new(sagas.clone());
    let route = |kinds: &[&str]| {
        kinds
            .iter()
            .fold(Router::new(), |r, kind| r.route(*kind, handler.clone()))
    };
    [
        (
            inventario::EVENTS_TOPIC,
            route(&[
                inventario::RESERVED,
                inventario::REFUSED,
                inventario::RELEASED,
            ])
            .ignore(inventario::STOCK_UPDATED),
        ),
        (
            pagos::EVENTS_TOPIC,
            route(&[
                pagos::PAYMENT_CONFIRMED,
                pagos::PAYMENT_DECLINED,
                pagos::PAYMENT_REFUNDED,
            ]),
        ),
        (
            reparto::EVENTS_TOPIC,
            route(&[reparto::ASSIGNED, reparto::REFUSED]),
        ),
    ]
}

/// Starts the orchestrator as member `<instance>-saga`; the returned task ends when one part
/// does (its error), or after `stop`.
pub(super) async fn spawn(
    system: &System,
    sagas: Sagas,
    instance: &str,
    stop: CancellationToken,
) -> anyhow::Result<Task> {
    let broker = system.broker().await.context("opening the broker")?;
    ensure_topics(&broker).await?;
    let child = stop.child_token();
    let member = format!("{instance}-saga");
    let mut parts: Vec<Part> = Vec::new();
    for (topic, router) in routers(&sagas) {
        let names = (SAGA_GROUP, topic, member.clone());
        let worker = consumer_worker(system, &broker, router, names, sagas.db());
        let child = child.clone();
        // Named by the topic whose answers it applies.
        parts.push((topic, async move { Ok(worker.run(child).await?) }.boxed()));
    }
    let (timers, every) = (child.clone(), TIMERS_EVERY);
    parts.push((
        "saga timers",
        async move { Ok(sagas.run_timers(every, timers).await?) }.boxed(),
    ));
    tracing::info!(instance, "order saga orchestrator started");
    Ok(run_together(parts, child))
}
