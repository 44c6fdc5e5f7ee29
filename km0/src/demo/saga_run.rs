//! The demo through the order saga: the gateway with the plan's faults, pedidos orchestrating,
//! inventario, pagos, reparto (with a fleet of couriers who deliver and free up) and catalogo,
//! all in this process; once every saga is over and every group has consumed everything,
//! some commands and replies of the run, and every compensation (refunds, releases), are
//! published a second time, and every service's rows must read the same afterwards.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use entrega::saga::Sagas;
use entrega::{Backoff, CancellationToken};
use entrega_core::now_ms;

use super::backlog::Backlog;
use super::facts::{summarise, Snapshot, Sources};
use super::plan::{DemoPlan, COVERED_CITIES};
use super::redeliver::{Pick, Replayable};
use super::{client, elapsed_ms, DemoOptions};
use crate::services::inventario::{self, StockStore};
use crate::services::pagos;
use crate::services::pasarela::Ledger;
use crate::services::pedidos::{OrderStore, SagaTimings};
use crate::services::reparto::{DeliveryState, DeliveryStore};
use crate::services::{pasarela, reparto};
use crate::wiring::{topics, Broker, Components, System};

/// Couriers the demo adds in each city reparto serves: enough that a run waits for a free
/// one now and then, not for minutes.
const COURIERS_PER_CITY: usize = 40;
/// How often the demo's couriers finish the deliveries they hold.
const DELIVER_EVERY: Duration = Duration::from_millis(100);
/// How long the rows and the backlog must stay the same to count as settled.
const SETTLED_FOR: Duration = Duration::from_millis(1_500);

/// The stores and the broker the run is watched through.
pub struct SagaWatch {
    orders: OrderStore,
    sagas: Sagas,
    ledger: Ledger,
    deliveries: DeliveryStore,
    stock: StockStore,
    payments_outbox: entrega::OutboxPorts,
    broker: Broker,
}

/// What the saga part of a run measured, for the report.
pub struct SagaRun {
    /// Orders placed and cancels asked.
    pub placed: client::Placed,
    /// Time to place the orders, in ms.
    pub placing_ms: u64,
    /// Time until every saga was over and everything consumed, in ms.
    pub total_ms: u64,
    /// Whether that happened before the deadline.
    pub drained: bool,
    /// Outbox rows unpublished at the end, over every service.
    pub outbox_pending: u64,
    /// Dead letters this run added, over every group.
    pub dead_letters: u64,
    /// The summary and the saga invariants.
    pub summary: super::facts::SagaSummary,
    /// Each product's units against the units of the orders that ended paid.
    pub stock: Vec<super::report::StockCheck>,
}

/// The timings of the demo's sagas: the defaults, with deadlines as long as the run may
/// take (a loaded machine answers slowly, which is not a failure) and resends that wait
/// longer than the queue of a run in full swing.
pub fn timings(run_timeout: Duration) -> SagaTimings {
    SagaTimings {
        step_deadline: run_timeout,
        delivery_deadline: run_timeout,
        resend: Backoff::new(Duration::from_secs(10), Duration::from_secs(30)).with_jitter(0.1),
        ..SagaTimings::default()
    }
}

impl SagaWatch {
    /// Opens what the run is watched through (opening migrates).
    pub async fn open(system: &System) -> anyhow::Result<Self> {
        let orders = system.pedidos().await.context("opening pedidos")?;
        let sagas = system.sagas(&orders).await.context("opening the sagas")?;
        let payments = system.pagos().await.context("opening pagos")?;
        Ok(Self {
            sagas,
            ledger: system.pasarela().await.context("opening the gateway")?,
            deliveries: system.reparto().await.context("opening reparto")?,
            stock: system.inventario().await.context("opening inventario")?,
            payments_outbox: payments.db().outbox(),
            orders,
            broker: system.broker().await.context("opening the broker")?,
        })
    }

    fn sources(&self) -> Sources<'_> {
        Sources {
            orders: &self.orders,
            sagas: &self.sagas,
            ledger: &self.ledger,
            deliveries: &self.deliveries,
            stock: &self.stock,
        }
    }

    /// Unpublished outbox rows of pedidos, inventario, pagos and reparto.
    async fn outbox_pending(&self) -> anyhow::Result<u64> {
        Ok(self.outbox_pending_in().await?.iter().map(|(_, n)| n).sum())
    }

    /// The services whose outbox holds unpublished rows, with how many each.
    async fn outbox_pending_in(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let now = now_ms();
        let mut pending = Vec::new();
        for (service, outbox) in [
            ("pedidos", self.orders.db().outbox()),
            ("inventario", self.stock.db().outbox()),
            ("pagos", self.payments_outbox.clone()),
            ("reparto", self.deliveries.db().outbox()),
        ] {
            let n = outbox.maintenance.status(now).await?.pending;
            if n > 0 {
                pending.push((service.to_owned(), n));
            }
        }
        Ok(pending)
    }

    async fn close(&self) {
        for db in [
            self.orders.db(),
            self.ledger.db(),
            self.deliveries.db(),
            self.stock.db(),
        ] {
            db.close().await;
        }
        self.broker.close().await;
    }
}

/// Runs the orders of `plan` through the saga on `system` (with saga timings set).
pub async fn run(
    system: &System,
    plan: &DemoPlan,
    run_id: &str,
    options: &DemoOptions,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<SagaRun> {
    let saga_plan = plan
        .saga
        .as_ref()
        .context("a saga run needs the saga's plan")?;
    let watch = SagaWatch::open(system).await?;
    for product in &plan.stock {
        let units = i32::try_from(product.start).context("stock beyond i32")?;
        watch.stock.set_units(&product.product, units).await?;
    }
    for (city, _, _) in COVERED_CITIES {
        for n in 1..=COURIERS_PER_CITY {
            let tag: String = city.chars().take(3).collect::<String>().to_uppercase();
            watch
                .deliveries
                .add_courier(&format!("R-{tag}-D{n:02}"), city)
                .await?;
        }
    }
    let before = Backlog::read(&watch.broker).await?;
    let topics = topics();
    let mut replayable = Vec::with_capacity(topics.len());
    for topic in topics.iter().copied() {
        replayable.push(Replayable::open(&watch.broker, run_id, topic).await?);
    }

    let started = Instant::now();
    let instance = format!("demo-{run_id}");
    let mut gateway = Components::none(&format!("{instance}-pasarela")).with(&pasarela::COMPONENT);
    gateway.faults = saga_plan.faults.clone();
    let gateway = system
        .start(gateway, "127.0.0.1:0".parse()?)
        .await
        .context("starting the gateway")?;
    let gateway_addr = gateway.http_addr().context("the gateway serves HTTP")?;
    let mut components = Components::all(&instance);
    components.add(&reparto::COMPONENT);
    components.add(&pagos::COMPONENT);
    components.pasarela_url = Some(format!("http://{gateway_addr}"));
    let running = system
        .start(components, "127.0.0.1:0".parse()?)
        .await
        .context("starting pedidos, relay, inventario, catalogo, pagos and reparto")?;
    let addr = running.http_addr().context("the demo needs the HTTP API")?;
    // Every order id of the run starts so (see `DemoPlan::generate`).
    let prefix = format!("P-{run_id}-");
    let couriers = CancellationToken::new();
    let courier_task = tokio::spawn(deliver_until(
        watch.deliveries.clone(),
        prefix.clone(),
        couriers.clone(),
    ));

    let cancel: Vec<bool> = saga_plan
        .fates
        .iter()
        .map(|f| *f == super::plan::Fate::CustomerCancel)
        .collect();
    let placed =
        client::place_all(addr, &plan.orders, &cancel, options.concurrency, progress).await;
    progress.finish();
    let placing_ms = elapsed_ms(started);

    let deadline = Instant::now() + options.timeout;
    let mut drained = settle(&watch, plan, &prefix, deadline).await?;
    couriers.cancel();
    courier_task.await.context("the couriers")??;
    let total_ms = elapsed_ms(started);
    let first = Snapshot::read(&watch.sources(), plan, &prefix).await?;

    let mut redelivered = 0;
    // Some of every topic, and every compensation: a refund or a release delivered twice
    // must change nothing.
    let pick = Pick {
        first: options.redeliver.div_ceil(topics.len()),
        every: &[pagos::REFUND, inventario::RELEASE],
    };
    for tap in replayable {
        redelivered += match drained {
            true => tap.redeliver(&watch.broker, pick).await? as u64,
            false => {
                tap.discard(&watch.broker).await?;
                0
            }
        };
    }
    if drained && redelivered > 0 {
        drained = settle(&watch, plan, &prefix, deadline).await?;
    }
    let last = Snapshot::read(&watch.sources(), plan, &prefix).await?;
    running.stop().await.context("stopping the services")?;
    gateway.stop().await.context("stopping the gateway")?;

    let after = Backlog::read(&watch.broker).await?;
    let (mut summary, stock) = summarise(plan, &first, &last);
    summary.redelivered = redelivered;
    summary.cancels_taken = placed.cancels_taken;
    summary.cancels_too_late = placed.cancels_too_late;
    summary.dead_letters_in = after.new_dead_letters(&before);
    summary.outbox_pending_in = watch.outbox_pending_in().await?;
    let outbox_pending = summary.outbox_pending_in.iter().map(|(_, n)| n).sum();
    watch.close().await;
    Ok(SagaRun {
        placed,
        placing_ms,
        total_ms,
        drained,
        outbox_pending,
        dead_letters: after.dead_letters.saturating_sub(before.dead_letters),
        summary,
        stock,
    })
}

/// Waits until every saga of the plan is over, every outbox is drained and the rows have
/// read the same for [`SETTLED_FOR`], and then until no group has anything left to consume
/// (or the same records stay unconsumed over two reads [`SETTLED_FOR`] apart: a group that
/// never committed on an old topic of a shared broker). `false` if `deadline` came first.
/// The backlog is read only once the rows are quiet: on Kafka it asks each group's
/// coordinator.
async fn settle(
    watch: &SagaWatch,
    plan: &DemoPlan,
    prefix: &str,
    deadline: Instant,
) -> anyhow::Result<bool> {
    let mut stable: Option<(Instant, Snapshot)> = None;
    let mut last_backlog: Option<Backlog> = None;
    loop {
        let snapshot = Snapshot::read(&watch.sources(), plan, prefix).await?;
        let pending = watch.outbox_pending().await?;
        let quiet = snapshot.all_final() && pending == 0;
        tracing::debug!(finished = snapshot.finished(), pending, "demo: settling");
        stable = match stable {
            Some((since, s)) if quiet && s == snapshot => Some((since, s)),
            _ if quiet => Some((Instant::now(), snapshot)),
            _ => None,
        };
        if let Some((since, _)) = &stable {
            if since.elapsed() >= SETTLED_FOR {
                let backlog = Backlog::read(&watch.broker).await?;
                tracing::debug!(unconsumed = backlog.unconsumed, "demo: backlog");
                if backlog.unconsumed == 0 || last_backlog.as_ref() == Some(&backlog) {
                    return Ok(true);
                }
                last_backlog = Some(backlog);
                stable = None;
            }
        }
        if Instant::now() >= deadline {
            tracing::warn!("the demo's deadline came first");
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The demo's couriers: every [`DELIVER_EVERY`] each delivery of the run that has a courier
/// is made, which frees the courier for a pending one. Until `stop`.
async fn deliver_until(
    deliveries: DeliveryStore,
    prefix: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        for delivery in deliveries.deliveries().await? {
            if delivery.state == DeliveryState::Assigned && delivery.order_id.starts_with(&prefix) {
                deliveries.complete(&delivery.order_id, now_ms()).await?;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(DELIVER_EVERY) => {}
        }
    }
}
