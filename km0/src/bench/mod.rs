//! `km0 bench relay|consume|e2e|poison|seed|rpc|curve`: throughput and latency of km0 on
//! entrega, and how they grow with load.
//!
//! Every measurement runs on databases of its own (`km0bench<id>_*` on PostgreSQL, a
//! `km0bench<id>` directory on SQLite), created for it and removed afterwards. On PostgreSQL
//! the throughput benches also run `pgbench` over the very statements the engine issues, on an
//! identically prefilled database: that is the ceiling the engine is compared with.
//! Each configuration is measured `--runs` times and the median is reported.

mod arrivals;
mod consume;
mod cpu;
mod curves;
mod e2e;
mod fleet;
mod pgbench;
mod plot;
mod poison;
mod progress;
mod relay;
mod relay_steady;
mod relay_wal;
mod relay_wal_ceiling;
mod report;
mod rpc;
mod saga;
mod scale;
mod seed;
mod timed_publisher;
mod timed_reader;
mod timed_subscriber;
mod workload;

use anyhow::Context as _;
use clap::{Args, Subcommand};

pub use consume::ConsumeArgs;
pub use curves::{Curve, CurveArgs};
pub use e2e::E2eArgs;
pub use poison::PoisonArgs;
pub use relay::RelayArgs;
pub use report::{BenchReport, Measurement, Target};
pub use saga::SagaArgs;
pub use seed::SeedArgs;

use crate::services::inventario::GROUP;
use crate::services::pedidos::TOPIC;
use crate::wiring::config::{
    is_postgres, sqlite_path, with_database, BrokerUrl, DataPlace, Databases,
};
use crate::wiring::System;

/// `km0 bench ...`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which bench.
    #[command(subcommand)]
    pub command: BenchCommand,
    /// Print the report as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, global = true)]
    pub output: Option<std::path::PathBuf>,
    /// Measurements per configuration; the median is reported.
    #[arg(long, global = true, default_value_t = 3)]
    pub runs: usize,
    /// Keep the bench databases instead of removing them.
    #[arg(long, global = true)]
    pub keep: bool,
    /// The `pgbench` binary used for the ceilings.
    #[arg(long, global = true, default_value = "pgbench")]
    pub pgbench: String,
    /// The `pg_recvlogical` binary used for the WAL relay's ceiling.
    #[arg(long, global = true, default_value = "pg_recvlogical")]
    pub pg_recvlogical: String,
    /// Skip the ceilings (pgbench, pg_recvlogical).
    #[arg(long, global = true)]
    pub no_ceiling: bool,
}

/// The benches.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Relay drain: events/s publishing a prefilled outbox into the broker.
    Relay(RelayArgs),
    /// Consume: messages/s of the inventario consumer draining a prefilled topic.
    Consume(ConsumeArgs),
    /// End to end: commit-to-consume latency at a fixed arrival rate.
    E2e(E2eArgs),
    /// Poison: healthy events' latency while one message always fails, per retry strategy.
    Poison(PoisonArgs),
    /// Seed: entrega's relay and consumer against the seed's Python ones, same rows, same
    /// broker (PostgreSQL and Kafka only).
    Seed(SeedArgs),
    /// Request/reply on RabbitMQ: round trips and calls/s of pagos' authorisations against
    /// the seed's client and a trivial responder.
    Rpc(rpc::RpcArgs),
    /// A scaling curve: one bench over a range of one setting, written as CSV and SVG.
    Curve(CurveArgs),
    /// Scaling with processes: each stage as 1, 2, 3 `km0 run` processes, with the CPU of
    /// each.
    Scale(scale::ScaleArgs),
    /// The whole order saga (reserve, charge at the gateway simulator, courier) with each
    /// service a process: sagas/s at saturation, durations at fixed rates, where the time goes.
    Saga(SagaArgs),
}

/// Where a bench run keeps its data: the place named by `--database`, under fresh names, and
/// the broker: a fresh log database next to the others, or the Kafka cluster of `--broker`.
#[derive(Debug, Clone)]
pub(crate) struct BenchPlace {
    place: DataPlace,
    /// The `kafka://` URL, when the benches run on Kafka.
    kafka: Option<String>,
}

/// One measurement's deployment, and the names its events travel under.
#[derive(Debug, Clone)]
pub(crate) struct BenchRun {
    /// Fresh databases (and a fresh log database, unless on Kafka).
    pub(crate) system: System,
    /// Topic of the order events: km0's own in a fresh log database; on a Kafka cluster,
    /// whose topics outlive the run, one of the run's own.
    pub(crate) topic: String,
    /// Consumer group of the inventario worker (the run's own on Kafka, like its topic).
    pub(crate) group: String,
}

impl BenchPlace {
    /// A fresh deployment for one measurement: `km0bench<id>_pedidos`, `_inventario` and
    /// `_broker` on PostgreSQL, or `<dir>/km0bench<id>/` on SQLite; on Kafka the broker is
    /// the cluster, with topic `pedidos.eventos.km0bench<id>` and group `inventario-km0bench<id>`.
    pub(crate) fn fresh(&self) -> BenchRun {
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
        let prefix = format!("km0bench{id}_");
        let (databases, log_url) = match &self.place {
            DataPlace::PostgresServer(server) => (
                Databases {
                    place: self.place.clone(),
                    prefix: Some(prefix.clone()),
                },
                with_database(server, &format!("{prefix}broker")),
            ),
            DataPlace::SqliteDir(dir) => {
                let dir = dir.join(format!("km0bench{id}"));
                let broker = format!("sqlite://{}", dir.join("broker.db").display());
                (Databases::new(DataPlace::SqliteDir(dir)), broker)
            }
        };
        match &self.kafka {
            Some(url) => BenchRun {
                system: System::new(databases, url.clone()),
                topic: format!("{TOPIC}.km0bench{id}"),
                group: format!("{GROUP}-km0bench{id}"),
            },
            None => BenchRun {
                system: System::new(databases, log_url),
                topic: TOPIC.to_owned(),
                group: GROUP.to_owned(),
            },
        }
    }

    /// The PostgreSQL server, when the benches run on one.
    pub(crate) fn postgres_server(&self) -> Option<&str> {
        match &self.place {
            DataPlace::PostgresServer(server) => Some(server),
            DataPlace::SqliteDir(_) => None,
        }
    }

    /// Whether the broker is a Kafka cluster.
    pub(crate) fn on_kafka(&self) -> bool {
        self.kafka.is_some()
    }

    /// `postgres`, `sqlite`, `postgres + kafka` or `sqlite + kafka`, for reports.
    pub(crate) fn backend(&self) -> &'static str {
        match (&self.place, self.on_kafka()) {
            (DataPlace::PostgresServer(_), false) => "postgres",
            (DataPlace::SqliteDir(_), false) => "sqlite",
            (DataPlace::PostgresServer(_), true) => "postgres + kafka",
            (DataPlace::SqliteDir(_), true) => "sqlite + kafka",
        }
    }
}

/// Settings shared by every bench.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    pub(crate) place: BenchPlace,
    pub(crate) runs: usize,
    pub(crate) keep: bool,
    pub(crate) pgbench: Option<String>,
    /// The `pg_recvlogical` binary for the WAL ceiling; `None` without ceilings.
    pub(crate) recvlogical: Option<String>,
}

impl Common {
    /// Removes a run's databases unless `--keep` was given.
    pub(crate) async fn cleanup(&self, run: &BenchRun) -> anyhow::Result<()> {
        if self.keep {
            eprintln!("kept: {}", run.system.describe());
            return Ok(());
        }
        run.system
            .destroy()
            .await
            .context("removing the bench databases")
    }
}

/// Runs the bench named by `args` on the deployment place of `database` (`--database`), prints
/// its report and returns it. A `kafka://` `broker` (`--broker`) puts the events on that
/// cluster; any other broker URL means a fresh log database per measurement.
pub async fn run(database: &str, broker: &str, args: &BenchArgs) -> anyhow::Result<BenchReport> {
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build measures the compiler, not km0; use --release");
    }
    let place = if is_postgres(database) {
        DataPlace::parse(database)?
    } else {
        let dir = sqlite_path(database).context("--database must be sqlite:// or postgres://")?;
        DataPlace::parse(&format!("sqlite://{dir}"))?
    };
    let parsed = BrokerUrl::parse(broker)?;
    let report = if let BenchCommand::Saga(a) = &args.command {
        let backend = match (&place, &parsed) {
            (DataPlace::SqliteDir(_), BrokerUrl::SqliteLog(_)) => "sqlite".to_owned(),
            (DataPlace::PostgresServer(_), BrokerUrl::PostgresLog(_)) => "postgres".to_owned(),
            (_, BrokerUrl::Kafka(..)) => format!("{} + kafka", place_name(&place)),
            (_, BrokerUrl::Amqp(..)) => format!("{} + rabbitmq", place_name(&place)),
            _ => format!("{} + a log database", place_name(&place)),
        };
        // A log broker lives beside the run's databases, as in the other benches.
        let broker = match (&parsed, &place) {
            (BrokerUrl::SqliteLog(_) | BrokerUrl::PostgresLog(_), DataPlace::SqliteDir(dir)) => {
                format!("sqlite://{}", dir.join("broker.db").display())
            }
            (
                BrokerUrl::SqliteLog(_) | BrokerUrl::PostgresLog(_),
                DataPlace::PostgresServer(server),
            ) => with_database(server, "km0bench_broker"),
            _ => broker.to_owned(),
        };
        let databases = Databases {
            place,
            prefix: Some("km0bench_".to_owned()),
        };
        let base = System::new(databases, broker);
        saga::run(&base, &backend, args.runs.max(1), args.keep, a).await?
    } else if let BenchCommand::Rpc(a) = &args.command {
        let BrokerUrl::Amqp(url, _) = &parsed else {
            anyhow::bail!("km0 bench rpc runs on RabbitMQ: --broker amqp://...");
        };
        let common = Common {
            pgbench: None,
            recvlogical: None,
            place: BenchPlace { place, kafka: None },
            runs: args.runs.max(1),
            keep: args.keep,
        };
        rpc::run(&common, url, a).await?
    } else {
        let kafka = match parsed {
            BrokerUrl::Kafka(url, _) => Some(url),
            BrokerUrl::SqliteLog(_) | BrokerUrl::PostgresLog(_) => None,
            BrokerUrl::Amqp(..) => anyhow::bail!(
                "the relay, consume, e2e, poison, seed, curve and scale benchmarks measure logs (a database \
                 or Kafka), not RabbitMQ; km0 bench rpc measures it"
            ),
        };
        let place = BenchPlace { place, kafka };
        let common = Common {
            pgbench: (!args.no_ceiling && place.postgres_server().is_some())
                .then(|| args.pgbench.clone()),
            recvlogical: (!args.no_ceiling && place.postgres_server().is_some())
                .then(|| args.pg_recvlogical.clone()),
            place,
            runs: args.runs.max(1),
            keep: args.keep,
        };
        match &args.command {
            BenchCommand::Relay(a) => relay::run(&common, a).await?,
            BenchCommand::Consume(a) => consume::run(&common, a).await?,
            BenchCommand::E2e(a) => e2e::run(&common, a).await?,
            BenchCommand::Poison(a) => poison::run(&common, a).await?,
            BenchCommand::Seed(a) => seed::run(&common, a).await?,
            BenchCommand::Curve(a) => curves::run(&common, a).await?,
            BenchCommand::Scale(a) => scale::run(&common, a).await?,
            BenchCommand::Rpc(_) => anyhow::bail!("the rpc bench runs on RabbitMQ only"),
            BenchCommand::Saga(_) => anyhow::bail!("the saga bench is run above"),
        }
    };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.output {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    Ok(report)
}

/// `sqlite` or `postgres`.
fn place_name(place: &DataPlace) -> &'static str {
    match place {
        DataPlace::SqliteDir(_) => "sqlite",
        DataPlace::PostgresServer(_) => "postgres",
    }
}

/// Progress on stderr, so `--json` output stays clean.
pub(crate) fn progress(line: impl std::fmt::Display) {
    eprintln!("  {line}");
}
