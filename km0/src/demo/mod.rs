//! `km0 demo`: the whole system in one process, orders placed through the real HTTP API with
//! concurrency, then a report whose invariants decide the exit code. By default the orders
//! go through the order saga ([`saga_run`]); `--no-saga` runs the seed's first flow only.

mod backlog;
mod client;
mod facts;
mod plan;
mod redeliver;
mod report;
mod saga_run;

use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use facts::{FateCount, SagaSummary};
pub use plan::{DemoPlan, Fate, ProductPlan, SagaPlan};
pub use report::{DemoReport, Invariant, StockCheck};

use entrega::OutboxPorts;
use entrega_core::{now_ms, OutboxStatus};

use crate::services::inventario::{StockStore, CONSUMER};
use crate::services::pedidos::{OrderStore, TOPIC};
use crate::wiring::{dead_letter_topic, dead_letters_of, Broker, Components, System};

/// How a demo run goes.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Orders to place.
    pub orders: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Fresh databases for this run (instead of the configured ones).
    pub fresh: bool,
    /// Keep fresh databases afterwards.
    pub keep: bool,
    /// Bound on waiting for every order to be consumed.
    pub timeout: Duration,
    /// Seed of the generated orders.
    pub seed: u64,
    /// Show progress bars.
    pub progress: bool,
    /// Events to publish a second time once everything is consumed, as a relay that died
    /// between publish and mark would; each must be absorbed as a duplicate.
    pub redeliver: usize,
    /// Through the order saga (reserve, charge, courier) with declines, gateway faults,
    /// uncovered cities and customer cancels; otherwise the seed's first flow only
    /// (pedidos → inventario).
    pub saga: bool,
    /// The report goes to stdout as JSON: the header and the plan go to stderr.
    pub json: bool,
}

impl DemoOptions {
    /// Prints `text` where the run's narration goes (stderr when stdout carries JSON).
    fn say(&self, text: &str) {
        if self.json {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    }
}

/// Figures that may already be non-zero in reused databases; the run reports differences.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    consumed: u64,
    published: u64,
    /// `None` on RabbitMQ, which keeps no log to count.
    on_topic: Option<u64>,
    dead_letters: u64,
}

impl Counters {
    async fn read(watch: &Watch) -> anyhow::Result<Self> {
        Ok(Self {
            consumed: watch.stock.processed(CONSUMER).await?,
            published: watch.outbox().await?.published,
            on_topic: match watch.broker.has_offsets() {
                true => Some(watch.broker.topic_total(TOPIC).await?),
                false => None,
            },
            dead_letters: dead_letter_count(&watch.broker).await?,
        })
    }
}

/// Dead letters of the stock consumer so far: records of its dead-letter topic, or messages
/// in its dead-letter queue on RabbitMQ.
async fn dead_letter_count(broker: &Broker) -> anyhow::Result<u64> {
    let Some(amqp) = broker.as_amqp() else {
        return Ok(broker.topic_total(&dead_letter_topic()).await?);
    };
    let queue = dead_letters_of(broker);
    let depths = amqp.queue_depths(&[queue]).await?;
    Ok(depths
        .iter()
        .map(|d| d.ready + d.unacked.unwrap_or(0))
        .sum())
}

/// Connections the demo observes the run through, opened once (opening migrates).
struct Watch {
    stock: StockStore,
    orders: OrderStore,
    outbox: OutboxPorts,
    broker: Broker,
}

impl Watch {
    async fn open(system: &System) -> anyhow::Result<Self> {
        let orders = system.pedidos().await.context("opening pedidos")?;
        Ok(Self {
            stock: system.inventario().await.context("opening inventario")?,
            outbox: orders.db().outbox(),
            orders,
            broker: system.broker().await.context("opening the broker")?,
        })
    }

    async fn outbox(&self) -> anyhow::Result<OutboxStatus> {
        Ok(self.outbox.maintenance.status(now_ms()).await?)
    }

    async fn close(&self) {
        self.stock.db().close().await;
        self.orders.db().close().await;
        self.broker.close().await;
    }
}

/// Runs the demo and returns its report (whether the invariants hold is the report's to say).
pub async fn run(system: &System, options: &DemoOptions) -> anyhow::Result<DemoReport> {
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let system = match (options.saga, system.saga()) {
        (true, None) => system.clone().with_saga(saga_run::timings(options.timeout)),
        _ => system.clone(),
    };
    let system = if options.fresh {
        system.fresh(&run_id)?
    } else {
        system
    };
    options.say(&format!("km0 demo {run_id}: {}\n", system.describe()));
    if options.saga {
        return run_saga(&system, options, &run_id).await;
    }

    let watch = Watch::open(&system).await?;
    let stock = &watch.stock;
    let plan = DemoPlan::generate(options.orders, &run_id, options.seed);
    for product in &plan.stock {
        let units = i32::try_from(product.start).context("stock beyond i32")?;
        stock.set_units(&product.product, units).await?;
    }
    options.say(&plan.render());
    let before = Counters::read(&watch).await?;
    // On a shared broker (Kafka) the topic may hold earlier runs' events: this run's start
    // where it ends now.
    let replayable = redeliver::Replayable::open(&watch.broker, &run_id, TOPIC).await?;

    let started = Instant::now();
    let running = system
        .start(
            Components::all(&format!("demo-{run_id}")),
            "127.0.0.1:0".parse()?,
        )
        .await
        .context("starting pedidos, relay and inventario")?;
    let addr = running.http_addr().context("the demo needs the HTTP API")?;

    // Both bars move together: events are consumed while orders are still being placed.
    let bars = if options.progress {
        MultiProgress::new()
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    };
    let total = plan.orders.len() as u64;
    let placing = bars.add(bar(total, "placed  "));
    let consuming = bars.add(bar(total, "consumed"));
    let watcher = {
        let (stock, consuming) = (stock.clone(), consuming.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(n) = stock.processed(CONSUMER).await {
                    consuming.set_position(n.saturating_sub(before.consumed));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let placed = client::place_all(addr, &plan.orders, &[], options.concurrency, &placing).await;
    placing.finish();
    let placing_ms = elapsed_ms(started);

    let deadline = Instant::now() + options.timeout;
    let drained = loop {
        let consumed = stock
            .processed(CONSUMER)
            .await?
            .saturating_sub(before.consumed);
        let pending = watch.outbox().await?.pending;
        if consumed >= placed.accepted && pending == 0 {
            consuming.set_position(consumed);
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    watcher.abort();
    consuming.finish();
    let redelivered = if drained {
        redeliver_and_wait(&watch, &running, replayable, options.redeliver, deadline).await?
    } else {
        replayable.discard(&watch.broker).await?;
        0
    };
    let total_ms = elapsed_ms(started);
    let consumer_stats = running.consumer_stats();
    running.stop().await.context("stopping the services")?;

    let after = Counters::read(&watch).await?;
    let mut checks = Vec::with_capacity(plan.stock.len());
    for product in &plan.stock {
        checks.push(StockCheck::new(
            product,
            stock.units(&product.product).await?,
        ));
    }
    let report = DemoReport {
        orders_planned: plan.orders.len() as u64,
        orders_accepted: placed.accepted,
        orders_failed: placed.failed,
        events_published: after.published.saturating_sub(before.published),
        messages_on_topic: after
            .on_topic
            .zip(before.on_topic)
            .map(|(a, b)| a.saturating_sub(b)),
        consumed: after.consumed.saturating_sub(before.consumed),
        duplicates: consumer_stats.map_or(0, |s| s.snapshot().duplicates),
        redelivered,
        dead_letters: after.dead_letters.saturating_sub(before.dead_letters),
        outbox_pending: watch.outbox().await?.pending,
        drained,
        stock: checks,
        placing_ms,
        total_ms,
        saga: None,
    };
    watch.close().await;
    finish(&system, options, report).await
}

/// The run through the order saga.
async fn run_saga(
    system: &System,
    options: &DemoOptions,
    run_id: &str,
) -> anyhow::Result<DemoReport> {
    let plan = DemoPlan::generate_saga(options.orders, run_id, options.seed);
    options.say(&plan.render());
    let bars = if options.progress {
        MultiProgress::new()
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    };
    let placing = bars.add(bar(plan.orders.len() as u64, "placed  "));
    let run = saga_run::run(system, &plan, run_id, options, &placing).await?;
    let report = DemoReport {
        orders_planned: plan.orders.len() as u64,
        orders_accepted: run.placed.accepted,
        orders_failed: run.placed.failed,
        redelivered: run.summary.redelivered,
        dead_letters: run.dead_letters,
        outbox_pending: run.outbox_pending,
        drained: run.drained,
        stock: run.stock,
        placing_ms: run.placing_ms,
        total_ms: run.total_ms,
        saga: Some(run.summary),
        ..DemoReport::default()
    };
    finish(system, options, report).await
}

/// Removes a fresh run's databases once it passed (a failed run keeps them: they are the
/// evidence) and hands the report back.
async fn finish(
    system: &System,
    options: &DemoOptions,
    report: DemoReport,
) -> anyhow::Result<DemoReport> {
    if options.fresh && !options.keep && report.passed() {
        system
            .destroy()
            .await
            .context("removing the demo databases")?;
    } else if options.fresh {
        if system.relay_source() == crate::wiring::relay::RelaySource::Wal {
            system
                .drop_idle_slots()
                .await
                .context("dropping the demo's replication slots")?;
        }
        options.say(&format!("databases kept: {}\n", system.describe()));
    }
    Ok(report)
}

/// Publishes `count` consumed events again and waits (until `deadline`) for the consumer to
/// have seen that many duplicates. Returns how many were published.
async fn redeliver_and_wait(
    watch: &Watch,
    running: &crate::wiring::Running,
    replayable: redeliver::Replayable,
    count: usize,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let sent = replayable
        .redeliver(&watch.broker, redeliver::Pick::first(count))
        .await? as u64;
    let Some(stats) = running.consumer_stats() else {
        return Ok(sent);
    };
    while stats.snapshot().duplicates < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(sent)
}

fn bar(len: u64, label: &'static str) -> ProgressBar {
    // Hidden until added to the MultiProgress, or it would draw a stray first frame.
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} {elapsed}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label);
    bar
}

pub(crate) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
