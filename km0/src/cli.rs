//! The `km0` command line: run the system whole or one component per process, migrate,
//! inspect the outbox, and the end-to-end demo.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::demo::{self, DemoOptions};
use crate::wiring::config::{BrokerUrl, DataPlace, Databases};
use crate::wiring::{self, Components, InUp, Retention, System};

/// Kilómetro Cero: orders and stock over entrega (outbox, relay, idempotent consumer).
#[derive(Debug, Parser)]
#[command(name = "km0", version, about, propagate_version = true)]
pub struct Cli {
    /// Where the services' databases live: `sqlite://DIR` (one file per service) or a
    /// PostgreSQL server URL `postgres://user@host:port` (databases created if missing).
    #[arg(
        long,
        global = true,
        env = "KM0_DATABASE",
        default_value = "sqlite://km0-data"
    )]
    pub database: String,

    /// The broker: the log transport's database (`sqlite://FILE` or
    /// `postgres://user@host:port/DB`), a Kafka cluster
    /// (`kafka://host:port[,host:port...][?session_timeout_ms=6000&replication_factor=3&...]`;
    /// topics km0 creates take the brokers' `default.replication.factor` unless
    /// `replication_factor` says otherwise, and with `acks=all` a record is confirmed once
    /// every in-sync replica has it, at least `min.insync.replicas` of them), or RabbitMQ
    /// (`amqp://user:pass@host:port/vhost`, `amqps://` with TLS). On Kafka and RabbitMQ,
    /// `namespace=PREFIX` puts PREFIX before every topic, group and queue name, keeping the
    /// deployment apart from others on the same broker; `km0 demo` runs under a namespace of
    /// its own and removes it after a run that passed.
    #[arg(
        long,
        global = true,
        env = "KM0_BROKER",
        default_value = "sqlite://km0-data/broker.db"
    )]
    pub broker: String,

    /// Prefix of the services' database names (`<prefix>pedidos`, `<prefix>inventario`);
    /// default `km0_` on PostgreSQL and none on SQLite.
    #[arg(long, global = true, env = "KM0_DB_PREFIX")]
    pub db_prefix: Option<String>,

    /// Lease period in milliseconds of relay lanes and consumer partitions: how long a
    /// silent (killed) instance keeps them before others take over.
    #[arg(
        long,
        global = true,
        env = "KM0_LEASE_TTL_MS",
        default_value_t = 10_000
    )]
    pub lease_ttl_ms: u64,

    /// Hours a published outbox row is kept before the relay purges it.
    #[arg(
        long,
        global = true,
        env = "KM0_OUTBOX_RETENTION_HOURS",
        default_value_t = 24
    )]
    pub outbox_retention_hours: u64,

    /// Days a processed-message key is kept before the consumer purges it; must exceed the
    /// broker's retention, or a very late redelivery would be applied again.
    #[arg(
        long,
        global = true,
        env = "KM0_INBOX_RETENTION_DAYS",
        default_value_t = 14
    )]
    pub inbox_retention_days: u64,

    /// Keys whose events the inventario worker applies at once (per-key chains, each in
    /// order); 1 applies one batch at a time. Orders share the same few stock rows, so
    /// concurrent batches wait on each other's row locks: above 1 is slower for km0's stock.
    #[arg(
        long,
        global = true,
        env = "KM0_KEY_CONCURRENCY",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub key_concurrency: u16,

    /// Most records a consumer takes per poll, which is also its transaction's size.
    /// inventario applies a whole poll in a constant number of statements, so larger polls
    /// amortise the commit under load (see docs/BENCHMARKS.md); a quiet partition's poll
    /// returns what there is without waiting to fill.
    #[arg(
        long,
        global = true,
        env = "KM0_MAX_BATCH",
        default_value_t = 1_000,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub max_batch: u16,

    /// The seed's first flow only (pedidos → inventario: no payment, no delivery) instead of
    /// the order saga pedidos runs every new order through by default (reserve, charge,
    /// assign a courier; compensations on a refusal, a deadline or a cancel). Every process
    /// of a deployment needs the same choice.
    #[arg(long, global = true, env = "KM0_NO_SAGA", alias = "sin-saga")]
    pub no_saga: bool,

    /// The order saga: the default; wins over `--no-saga` (or `KM0_NO_SAGA`) when both are
    /// given.
    #[arg(long, global = true, env = "KM0_SAGA", hide = true)]
    pub saga: bool,

    /// During a version transition, publishes this event type at its current version and
    /// at the one before (one `id_evento`; consumers read the copy they understand).
    /// Repeatable; `pedido.creado` is the one with an older version.
    #[arg(
        long = "publish-both",
        global = true,
        env = "KM0_PUBLISH_BOTH",
        value_delimiter = ','
    )]
    pub publish_both: Vec<String>,

    /// Where the relays read the outbox: `poll` the table (every database), or `wal`, the
    /// outbox's inserts decoded from PostgreSQL's logical replication stream, in commit order
    /// (PostgreSQL with wal_level=logical; the user needs REPLICATION).
    #[arg(
        long,
        global = true,
        env = "KM0_RELAY_SOURCE",
        value_enum,
        default_value_t = crate::wiring::relay::RelaySource::Poll
    )]
    pub relay_source: crate::wiring::relay::RelaySource,

    /// WAL relays create their replication slot again when it was dropped or PostgreSQL
    /// invalidated it: the recovery once the polling relay published what was left.
    #[arg(long, global = true, env = "KM0_RECREATE_SLOT")]
    pub recreate_slot: bool,

    /// Publishes every event with its CloudEvents 1.0 attributes in binary content mode
    /// (`ce_*` headers on Kafka, `cloudEvents:*` on RabbitMQ); the payload stays the envelope.
    #[arg(long, global = true, env = "KM0_CLOUDEVENTS")]
    pub cloudevents: bool,

    /// Seconds reparto's simulated couriers take to make a delivery once assigned, after
    /// which they are free for the next; 0: they never finish by themselves.
    #[arg(long, global = true, env = "KM0_DELIVERY_TIME_S", default_value_t = 30)]
    pub delivery_time_s: u64,

    /// Under the order saga: seconds the reservation and the charge may each take before the saga
    /// compensates (a reply after it is ignored, and undone if it did something).
    #[arg(
        long,
        global = true,
        env = "KM0_SAGA_STEP_DEADLINE_S",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub saga_step_deadline_s: u64,

    /// Logs as one JSON object per line on stderr (timestamp, level, target, fields, spans),
    /// for a log collector; without it, human-readable lines.
    #[arg(long, global = true, env = "KM0_LOG_JSON")]
    pub log_json: bool,

    /// Operators allowed to act in the web console, as `name:secret` (secret of at least 12
    /// characters); repeat the flag, or separate them with commas in the variable.
    #[arg(
        long = "console-token",
        global = true,
        env = "KM0_CONSOLE_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub console_tokens: Vec<String>,

    /// The operators' replay key (at least 16 bytes): `km0 dlq replay --group` signs the
    /// replay with it, and consumers skip a replay meant for another group only when its
    /// signature verifies. Every process of a deployment needs the same key. Read from the
    /// environment only, so it never shows in a process list.
    #[arg(skip = std::env::var("KM0_REPLAY_KEY").ok().filter(|k| !k.is_empty()))]
    pub replay_key: Option<String>,

    /// Lets `km0 up`, `km0 run` and the operator commands create missing PostgreSQL
    /// databases and apply pending migrations when they open them. Without it they expect
    /// `km0 migrate` to have run (as the databases' owner), and need only read and write
    /// rows. On SQLite (the embedded default) databases are always created and migrated on
    /// first use; the demo always migrates the databases it makes.
    #[arg(long, global = true, env = "KM0_MIGRATE")]
    pub migrate: bool,

    /// Longest wait in milliseconds for a request's headers on km0's HTTP servers; a client
    /// slower than that has its connection closed.
    #[arg(
        long,
        global = true,
        env = "KM0_HTTP_HEADER_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub http_header_timeout_ms: u64,

    /// Longest time in milliseconds to answer an HTTP request, its body included; past it
    /// the answer is `408`.
    #[arg(
        long,
        global = true,
        env = "KM0_HTTP_REQUEST_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub http_request_timeout_ms: u64,

    /// HTTP requests each server handles at once; more are answered `503` at once.
    #[arg(
        long,
        global = true,
        env = "KM0_HTTP_MAX_IN_FLIGHT",
        default_value_t = 256
    )]
    pub http_max_in_flight: usize,

    /// Serves km0's HTTP (pedidos, the gateway simulator, the operations endpoint) over TLS
    /// with this certificate chain (PEM); needs `--tls-key`.
    #[arg(long, global = true, env = "KM0_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,

    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, global = true, env = "KM0_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,

    /// A certificate authority (PEM) trusted for outgoing HTTPS (the gateway, the maps
    /// service), besides the public roots.
    #[arg(long, global = true, env = "KM0_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,

    /// Exports the spans of every traced request and message to an OpenTelemetry collector,
    /// e.g. http://127.0.0.1:4318 (`/v1/traces` is added for HTTP). The SDK's other
    /// `OTEL_*` variables apply (docs/OPERATIONS.md, "Traces").
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// How spans reach the collector.
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: crate::telemetry::otel::OtlpProtocol,

    /// How consumers retry.
    #[command(flatten)]
    pub retry: crate::wiring::config::RetryArgs,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole system in one process, until SIGINT/SIGTERM: pedidos' HTTP API and the
    /// order saga it runs, relay, inventario, pagos, reparto, catalogo (+ analitica on
    /// Kafka) and the payment gateway simulator; with `--no-saga`, the seed's first flow
    /// (pedidos, relay, inventario, catalogo).
    Up {
        /// Address of the pedidos HTTP API.
        #[arg(long, default_value = "127.0.0.1:8080")]
        http: SocketAddr,
        /// Address of the payment gateway simulator pagos charges through (not with
        /// `--no-saga`).
        #[arg(long, default_value = "127.0.0.1:8095")]
        pasarela: SocketAddr,
        /// Where to serve `/metrics`, `/healthz` and `/readyz` (docs/OPERATIONS.md), and the
        /// web console at `/console/`.
        #[arg(long, default_value = "127.0.0.1:9464")]
        ops: SocketAddr,
        /// Leave the web console off.
        #[arg(long)]
        no_console: bool,
    },
    /// One component per process (scale out, crash tests).
    Run(RunArgs),
    /// Creates every database and applies entrega's and the services' migrations, as their
    /// owner; services then run without migrating (see `--migrate`).
    Migrate {
        /// On PostgreSQL, also make each service's role (named as its database, e.g.
        /// `km0_inventario`; created with LOGIN if missing) the least-privileged user of its
        /// database: rows of its own tables only, no DDL, append-only audit. Run services
        /// with `--database 'postgres://km0_{service}@HOST:PORT'`.
        #[arg(long)]
        roles: bool,
    },
    /// Every service's outbox: its backlog, refused rows, releasing a held one.
    Outbox {
        /// What to show.
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Places orders through the real HTTP API and checks every invariant at the end.
    Demo(DemoArgs),
    /// The failures the seeds describe, made to happen: each scenario's naive variant beside
    /// the pattern, with the same fault, and a ledger per side (docs/LAB.md).
    Lab {
        /// What to do.
        #[command(subcommand)]
        command: crate::lab::LabCommand,
    },
    /// Benchmarks on fresh databases at `--database`, on a fresh log database or on the
    /// Kafka cluster of `--broker` (see docs/BENCHMARKS.md).
    Bench(crate::bench::BenchArgs),
    /// Consumer lag per group and partition (committed offset, end offset, lag), and the
    /// dead letters waiting on each topic's dead-letter topic.
    Lag(crate::ops::lag::LagArgs),
    /// Dead letters of km0's topics: list, stats, show, replay, discard, audit
    /// (procedure in docs/OPERATIONS.md).
    Dlq {
        /// What to do.
        #[command(subcommand)]
        command: crate::ops::dlq::DlqCommand,
    },
    /// km0's event contracts against the committed ones (`contracts/`): check, update, list.
    Contracts(crate::ops::contracts::ContractsArgs),
    /// Inventario's stock: list it, add units of a product.
    Stock {
        /// What to do.
        #[command(subcommand)]
        command: crate::ops::stock::StockCommand,
    },
    /// The order sagas: list, show one's timeline, retry one waiting for an operator.
    Saga {
        /// What to do.
        #[command(subcommand)]
        command: crate::ops::saga::SagaCommand,
    },
}

/// `km0 run <component>`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The component.
    #[arg(value_parser = component_names())]
    pub component: String,
    /// Address of the HTTP API: default 127.0.0.1:8080 for pedidos, 127.0.0.1:8095 for
    /// pasarela (the addresses `km0 up` uses).
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Name of this instance among its peers (relay lane owner, consumer group member),
    /// unique among those running; default `<component>@<host name>`. Kept across restarts, it
    /// lets a restarted instance take its lanes and partitions back at once, fencing out its
    /// earlier life; a second process started under a running one's name supersedes it.
    #[arg(long, env = "KM0_INSTANCE")]
    pub instance: Option<String>,
    /// Maps service of reparto (`GET <url>/ruta?ciudad=..&calle=..` → `{"km": ..}`);
    /// without it routes are computed in-process.
    #[arg(long, env = "KM0_MAPAS_URL")]
    pub mapas_url: Option<String>,
    /// The payment gateway pagos charges through (`POST <url>/cargos`); default
    /// http://127.0.0.1:8095.
    #[arg(long, env = "KM0_PASARELA_URL")]
    pub pasarela_url: Option<String>,
    /// Serve `/metrics`, `/healthz` and `/readyz` on this address (docs/OPERATIONS.md).
    #[arg(long)]
    pub ops: Option<SocketAddr>,
    /// Serve the web console at `/console/` on the `--ops` address.
    #[arg(long, requires = "ops")]
    pub console: bool,
    /// Faults the gateway simulator injects (pasarela only).
    #[command(flatten)]
    pub faults: FaultArgs,
}

/// `km0 run pasarela`'s faults for this run (`PUT /fallos` replaces them while it runs).
#[derive(Debug, Clone, Default, Args)]
pub struct FaultArgs {
    /// Added to every request, in milliseconds.
    #[arg(long, alias = "latencia-ms", default_value_t = 0)]
    pub latency_ms: u64,
    /// The next N requests answer 503 before charging.
    #[arg(long, alias = "fallar-503", default_value_t = 0)]
    pub fail_503: u32,
    /// The next N charges are recorded, then answered only after `--hang-ms`.
    #[arg(long, alias = "colgar-tras-cobro", default_value_t = 0)]
    pub hang_after_charge: u32,
    /// How long such an answer waits, in milliseconds.
    #[arg(long, alias = "colgar-ms", default_value_t = 10_000)]
    pub hang_ms: u64,
    /// A card to decline (repeat for several).
    #[arg(long = "decline-card", alias = "rechazar-tarjeta")]
    pub declined_cards: Vec<String>,
    /// Decline amounts above this, in cents.
    #[arg(long, alias = "importe-maximo-centimos")]
    pub max_amount_cents: Option<i64>,
}

impl FaultArgs {
    /// The gateway's faults.
    pub fn to_faults(&self) -> crate::services::pasarela::Faults {
        crate::services::pasarela::Faults {
            latency_ms: self.latency_ms,
            fail_503: self.fail_503,
            hang_after_charge: self.hang_after_charge,
            hang_ms: self.hang_ms,
            declined_cards: self.declined_cards.clone(),
            max_amount_cents: self.max_amount_cents,
        }
    }
}

/// The names `km0 run` takes: every component of [`crate::services::COMPONENTS`].
fn component_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        crate::services::COMPONENTS
            .iter()
            .map(|c| clap::builder::PossibleValue::new(c.name()).help(c.about())),
    )
}

impl Cli {
    /// The name this process's spans are exported under (`service.name`): `km0 <component>`
    /// for one component, `km0` otherwise; `OTEL_SERVICE_NAME` overrides it.
    pub fn service_name(&self) -> String {
        if let Ok(name) = std::env::var("OTEL_SERVICE_NAME") {
            if !name.trim().is_empty() {
                return name;
            }
        }
        match &self.command {
            Command::Run(args) => format!("km0 {}", args.component),
            _ => "km0".to_owned(),
        }
    }
}

/// `km0 outbox ...`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Pending events, the age of the oldest, and the rows the transport refused (waiting
    /// for a retry, or parked).
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Releases a parked row: the relay tries it again at once, ahead of its aggregate's
    /// later rows. Fails, changing nothing, for an unknown row or one that is not parked.
    Release {
        /// The row's id (`id_evento`).
        id: uuid::Uuid,
    },
    /// The latest releases, newest first: when, by which operating-system user, which row.
    Audit {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `km0 demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Orders to place.
    #[arg(long, default_value_t = 1000)]
    pub orders: usize,

    /// Events to publish a second time after all are consumed (default: 2% of the orders),
    /// to show the idempotent consumer absorbing them.
    #[arg(long)]
    pub redeliver: Option<usize>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Use the configured databases as they are instead of fresh ones for this run.
    #[arg(long)]
    pub reuse: bool,
    /// Keep the fresh databases after the run (they are removed otherwise).
    #[arg(long)]
    pub keep: bool,
    /// Seconds to wait for every order to be consumed.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Seed of the generated orders.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// No progress bars (logs, CI).
    #[arg(long)]
    pub no_progress: bool,
    /// Print the report as JSON (invariants included) instead of text; the header and
    /// the plan go to stderr.
    #[arg(long)]
    pub json: bool,
}

impl Cli {
    /// The command line as `km0` parses it: the global options (`--database`, `--broker`,
    /// ...) are listed once, by `km0 --help`; a subcommand's help shows its own options and
    /// says where the others are. They are accepted everywhere all the same.
    pub fn command_line() -> clap::Command {
        let mut command = <Self as clap::CommandFactory>::command();
        command.build();
        hide_globals(&mut command, true);
        command
    }

    /// Parses the process's arguments ([`Cli::command_line`]); prints help, the version or a
    /// usage error and exits when that is what they ask for.
    pub fn parse_args() -> Self {
        let matches = Self::command_line().get_matches();
        match <Self as clap::FromArgMatches>::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    }

    /// The per-service databases named by `--database` and `--db-prefix`.
    pub fn databases(&self) -> anyhow::Result<Databases> {
        let place = DataPlace::parse(&self.database)?;
        Ok(Databases {
            place,
            prefix: self.db_prefix.clone(),
        })
    }
}

/// Where `km0 run <component>` serves HTTP unless told: where `km0 up` serves it.
fn default_http(component: &str) -> SocketAddr {
    let port = if component == "pasarela" { 8095 } else { 8080 };
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Hides the global options in the help of `command`'s subcommands (not at the top), and
/// points there instead.
fn hide_globals(command: &mut clap::Command, top: bool) {
    if !top {
        let owned = std::mem::replace(command, clap::Command::new("km0"));
        *command = owned
            .mut_args(|arg| {
                if arg.is_global_set() {
                    arg.hide(true)
                } else {
                    arg
                }
            })
            .after_help("Global options (--database, --broker, --no-saga, ...): km0 --help");
    }
    for sub in command.get_subcommands_mut() {
        hide_globals(sub, false);
    }
}

/// Runs the parsed command; the exit code says whether it succeeded.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let databases = cli.databases()?;
    // A bad `--broker` or console token is reported before anything is opened.
    BrokerUrl::parse(&cli.broker)?;
    let operators =
        crate::console::Operators::parse(cli.console_tokens.iter().map(String::as_str))?;
    let mut system = System::new(databases, cli.broker.clone())
        .with_lease_ttl(Duration::from_millis(cli.lease_ttl_ms.max(100)))
        .with_key_concurrency(usize::from(cli.key_concurrency))
        .with_max_batch(usize::from(cli.max_batch))
        .with_retry(cli.retry.clone())
        .with_retention(Retention {
            outbox: Duration::from_secs(cli.outbox_retention_hours.saturating_mul(3600)),
            inbox: Duration::from_secs(cli.inbox_retention_days.max(1).saturating_mul(86_400)),
        });
    // On PostgreSQL only what the operator asked for creates or alters schema (services may
    // run as roles that only read and write rows); the demo makes its own databases; the
    // embedded default is files km0 owns, set up on first use.
    let embedded = matches!(system.databases().place, DataPlace::SqliteDir(_));
    let migrates = cli.migrate
        || embedded
        || matches!(&cli.command, Command::Demo(args) if !args.reuse)
        || matches!(cli.command, Command::Bench(_) | Command::Migrate { .. });
    system = system.with_schema(if migrates {
        wiring::SchemaMode::Migrate
    } else {
        wiring::SchemaMode::Expect
    });
    system = system.with_http_limits(wiring::http_server::HttpLimits {
        header_timeout: Duration::from_millis(cli.http_header_timeout_ms.max(1)),
        request_timeout: Duration::from_millis(cli.http_request_timeout_ms.max(1)),
        max_in_flight: cli.http_max_in_flight.max(1),
        ..Default::default()
    });
    if let (Some(cert), Some(key)) = (&cli.tls_cert, &cli.tls_key) {
        let tls = wiring::tls::ServerTls {
            cert: cert.clone(),
            key: key.clone(),
        };
        // A bad certificate or key is reported before anything starts.
        tls.acceptor()?;
        system = system.with_http_tls(tls);
    }
    if let Some(ca) = &cli.tls_ca {
        // An unreadable authority is reported before anything starts.
        let _checked = wiring::tls::client_builder(Some(ca))?;
        system = system.with_tls_ca(ca.clone());
    }
    if let Some(secret) = &cli.replay_key {
        let key = entrega_core::ReplayKey::new(secret.as_bytes()).context("KM0_REPLAY_KEY")?;
        system = system.with_replay_key(key);
    }
    if cli.cloudevents {
        system = system.with_cloudevents(true);
    }
    if cli.relay_source == crate::wiring::relay::RelaySource::Wal
        && !crate::wiring::config::is_postgres(&cli.database)
    {
        anyhow::bail!(
            "--relay-source wal reads PostgreSQL's WAL: --database must be a postgres:// URL"
        );
    }
    system = system
        .with_relay_source(cli.relay_source)
        .with_recreate_slot(cli.recreate_slot);
    if !cli.publish_both.is_empty() {
        let transitions = crate::contracts::transitions(&cli.publish_both)
            .map_err(|e| anyhow::anyhow!("--publish-both: {e}"))?;
        system = system.with_transitions(transitions);
    }
    system = system.with_delivery_time(
        (cli.delivery_time_s > 0).then(|| Duration::from_secs(cli.delivery_time_s)),
    );
    let saga = cli.saga || !cli.no_saga;
    // The demo times its saga to its own run.
    if saga && !matches!(cli.command, Command::Demo(_)) {
        system = system.with_saga(crate::services::pedidos::SagaTimings {
            step_deadline: Duration::from_secs(cli.saga_step_deadline_s),
            ..Default::default()
        });
    }
    // A crash test whose failpoint is misspelt, or that runs a build without failpoints,
    // must fail, not pass without crashing.
    if let Ok(spec) = std::env::var(entrega::failpoint::ENV) {
        let points = entrega::failpoint::parse(&spec)
            .with_context(|| format!("invalid {}", entrega::failpoint::ENV))?;
        if !points.is_empty() && !entrega::failpoint::ENABLED {
            anyhow::bail!(
                "{} is set, but this build of km0 has no failpoints (cargo feature `failpoints`)",
                entrega::failpoint::ENV
            );
        }
    }
    match cli.command {
        Command::Up {
            http,
            pasarela,
            ops,
            no_console,
        } => {
            let instance = format!("km0@{}", host_name());
            let transactions = system.broker_kind()?.has_transactions();
            let saga = system.saga().is_some();
            let mut components = Components::all(&instance);
            let mut apart = Components::none(&format!("{instance}-pasarela"));
            for component in crate::services::COMPONENTS {
                match component.in_up() {
                    InUp::WithTransactions if transactions => components.add(*component),
                    InUp::WithSaga if saga => components.add(*component),
                    InUp::Apart if saga => apart.add(*component),
                    _ => {}
                }
            }
            components.ops = Some(ops);
            if !no_console {
                components.console = Some(operators.clone());
            }
            if !saga {
                wiring::run_until_signal(&system, components, http).await?;
                return Ok(ExitCode::SUCCESS);
            }
            // The gateway serves HTTP of its own: it starts first, on its own address, and
            // stops last.
            let gateway = system.start(apart, pasarela).await?;
            let gateway_addr = gateway
                .http_addr()
                .context("the gateway simulator serves HTTP")?;
            let scheme = if system.http_tls()?.is_some() {
                "https"
            } else {
                "http"
            };
            components.pasarela_url = Some(format!("{scheme}://{gateway_addr}"));
            let outcome = wiring::run_until_signal(&system, components, http).await;
            let stopped = gateway.stop().await;
            outcome?;
            stopped?;
        }
        Command::Run(args) => {
            let component = wiring::named(&args.component)
                .with_context(|| format!("no component named `{}`", args.component))?;
            let instance = args
                .instance
                .unwrap_or_else(|| format!("{}@{}", component.name(), host_name()));
            let mut components = Components::none(&instance).with(component);
            components.mapas_url = args.mapas_url.clone();
            components.pasarela_url = args.pasarela_url.clone();
            components.faults = args.faults.to_faults();
            components.ops = args.ops;
            if args.console {
                components.console = Some(operators.clone());
            }
            let http = args.http.unwrap_or_else(|| default_http(component.name()));
            wiring::run_until_signal(&system, components, http).await?;
        }
        Command::Migrate { roles } => {
            let migrated = system.migrate(roles).await.context("migrating")?;
            println!("migrated: {}", migrated.join(", "));
            if let Ok(url) = std::env::var("KM0_SCHEMA_REGISTRY") {
                let prefix = std::env::var("KM0_SCHEMA_REGISTRY_PREFIX").unwrap_or_default();
                let registry =
                    crate::contracts::registry::SchemaRegistry::new(&url)?.with_prefix(prefix);
                let done = registry
                    .register(&crate::contracts::catalog())
                    .await
                    .context("registering the contracts (KM0_SCHEMA_REGISTRY)")?;
                let new = done.iter().filter(|r| r.new).count();
                println!(
                    "schema registry: {} contracts, {new} new, at {url}",
                    done.len()
                );
            }
        }
        Command::Outbox { command } => match command {
            OutboxCommand::Status { json } => crate::ops::outbox::status(&system, json).await?,
            OutboxCommand::Release { id } => crate::ops::outbox::release(&system, id).await?,
            OutboxCommand::Audit { limit, json } => {
                crate::ops::outbox::audit(&system, limit, json).await?
            }
        },
        Command::Demo(args) => {
            let options = DemoOptions {
                orders: args.orders,
                concurrency: args.concurrency.max(1),
                fresh: !args.reuse,
                keep: args.keep,
                timeout: Duration::from_secs(args.timeout),
                seed: args.seed,
                progress: !args.no_progress,
                redeliver: args.redeliver.unwrap_or(args.orders / 50),
                saga,
                json: args.json,
            };
            let report = demo::run(&system, &options).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report.to_json())?);
            } else {
                print!("{}", report.render());
            }
            if !report.passed() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Bench(args) => {
            crate::bench::run(&cli.database, &cli.broker, &args).await?;
        }
        Command::Lag(args) => crate::ops::lag::run(&system, args).await?,
        Command::Lab { command } => crate::lab::command(command).await?,
        Command::Stock { command } => crate::ops::stock::run(&system, command).await?,
        Command::Dlq { command } => return crate::ops::dlq::run(&system, command).await,
        Command::Saga { command } => crate::ops::saga::run(&system, command).await?,
        Command::Contracts(args) => return crate::ops::contracts::run(&args).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// `error` and its causes on one line, `: ` between them, each said once: a cause whose
/// text its wrapper already printed (`database rejected the operation: <cause>`) is not
/// repeated.
pub fn error_report(error: &anyhow::Error) -> String {
    let mut report = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if report.contains(&text) {
            continue;
        }
        if !report.is_empty() {
            report.push_str(": ");
        }
        report.push_str(&text);
    }
    report
}

/// This machine's name (a pod's or container's in those), for the default instance names:
/// stable across restarts, different on every machine.
fn host_name() -> String {
    hostname::get()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn consumers_poll_entregas_default_batch_unless_told() {
        use clap::Parser as _;
        let cli = super::Cli::try_parse_from(["km0", "demo"]).unwrap();
        assert_eq!(usize::from(cli.max_batch), entrega::DEFAULT_MAX_BATCH);
    }

    #[test]
    fn every_command_line_definition_is_consistent() {
        // Duplicate argument ids, bad defaults and conflicting flags fail here, not at the
        // first run of the subcommand that has them.
        super::Cli::command().debug_assert();
    }

    #[test]
    fn global_options_are_listed_once_and_accepted_everywhere() {
        let mut command = super::Cli::command_line();
        let top = command.render_help().to_string();
        assert!(
            top.contains("--database") && top.contains("--no-saga"),
            "{top}"
        );
        let show = command
            .find_subcommand_mut("saga")
            .and_then(|saga| saga.find_subcommand_mut("show"))
            .expect("km0 saga show")
            .render_help()
            .to_string();
        assert!(
            !show.contains("--tls-cert") && !show.contains("--database <"),
            "{show}"
        );
        assert!(show.contains("km0 --help"), "{show}");
        let matches = super::Cli::command_line()
            .try_get_matches_from([
                "km0",
                "outbox",
                "status",
                "--database",
                "sqlite://elsewhere",
            ])
            .expect("a global option after the subcommand");
        let cli = <super::Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        assert_eq!(cli.database, "sqlite://elsewhere");
        assert_eq!(super::default_http("pasarela").port(), 8095);
        assert_eq!(super::default_http("pedidos").port(), 8080);
    }

    #[test]
    fn an_error_report_says_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("not ready: run `km0 migrate`")]
        struct Behind;
        let store = entrega_core::StoreError::rejected(Behind);
        let error = anyhow::Error::new(store).context("opening the pedidos database");
        assert_eq!(
            super::error_report(&error),
            "opening the pedidos database: database rejected the operation: not ready: run \
             `km0 migrate`"
        );
    }
}
