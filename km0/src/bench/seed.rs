//! `km0 bench seed`: entrega's relay and idempotent consumer side by side with the ones the
//! seed writes (`interop/seed_relay.py`, `interop/seed_consumer.py`: Python, confluent_kafka
//! and psycopg), on the same PostgreSQL server, the same Kafka cluster and the same rows.
//!
//! Each rate is the items divided by the span of their own commit timestamps in the database
//! (`publicado_en` for the relays, `procesado_en` for the consumers), so neither side is
//! charged for its start-up or its group join.
//!
//! 1. The outbox is filled once; the seed's relay drains it into a topic of its own; the rows
//!    are made pending again and entrega's relay drains the very same rows.
//! 2. A topic is filled with `pedido.creado` events; entrega's consumer (inventario) and the
//!    seed's consumer drain it, each in its own group into its own database.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::json;
use sqlx::PgPool;

use super::consume::{self, ConsumeArgs};
use super::relay::{drain_prefilled, RelayArgs};
use super::report::{BenchReport, Measurement, Target};
use super::workload::{outbox_events, prefill_outbox, BENCH_UNITS};
use super::{progress, BenchRun, Common};
use crate::services::inventario::{CONSUMER, INITIAL_STOCK};
use crate::services::{inventario, pedidos};
use crate::wiring::config::with_database;
use crate::wiring::ensure_topic_and_dlq;

/// entrega's relay must reach this multiple of the seed's events/s.
const TARGET_RELAY_RATIO: f64 = 5.0;

/// `km0 bench seed`.
#[derive(Debug, Clone, Args)]
pub struct SeedArgs {
    /// Events in the outbox, drained by each relay.
    #[arg(long, default_value_t = 50_000)]
    pub events: usize,
    /// Messages on the topic, drained by each consumer: enough for the seed's consumer to
    /// show its steady behaviour (its per-message commits hold back its group's heartbeats
    /// until the session times out and the group rejoins, which a short run never sees).
    #[arg(long, default_value_t = 40_000)]
    pub messages: usize,
    /// Orders the events and messages belong to.
    #[arg(long, default_value_t = 10_000)]
    pub aggregates: usize,
    /// The Python with confluent_kafka and psycopg (`scripts/lib/python.sh` makes one).
    #[arg(long, env = "KM0_INTEROP_PYTHON", default_value = "python3")]
    pub python: String,
    /// Where the seed's scripts are.
    #[arg(long, default_value = "interop")]
    pub interop: PathBuf,
    /// Seconds one drain may take before the run fails.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
}

/// The four rates of one run.
struct Rates {
    seed_relay: f64,
    relay: f64,
    seed_consumer: f64,
    consumer: f64,
}

pub(crate) async fn run(common: &Common, args: &SeedArgs) -> anyhow::Result<BenchReport> {
    if !common.place.on_kafka() || common.place.postgres_server().is_none() {
        bail!("km0 bench seed compares on PostgreSQL and Kafka: --database postgres://... --broker kafka://...");
    }
    let mut rates = Vec::with_capacity(common.runs);
    for n in 1..=common.runs {
        progress(format!("seed vs entrega, run {n}/{}", common.runs));
        rates.push(measure(common, args).await?);
    }
    let column = |f: fn(&Rates) -> f64| rates.iter().map(f).collect::<Vec<f64>>();
    let rows = vec![
        Measurement::new("relay (seed, Python)", "events/s", column(|r| r.seed_relay)),
        Measurement::new("relay (entrega)", "events/s", column(|r| r.relay)),
        Measurement::new(
            "relay: entrega / seed",
            "x",
            column(|r| r.relay / r.seed_relay),
        )
        .with_target(|m| Target::at_least(TARGET_RELAY_RATIO, m)),
        Measurement::new(
            "consumer (seed, Python)",
            "msgs/s",
            column(|r| r.seed_consumer),
        ),
        Measurement::new("consumer (entrega)", "msgs/s", column(|r| r.consumer)),
        Measurement::new(
            "consumer: entrega / seed",
            "x",
            column(|r| r.consumer / r.seed_consumer),
        ),
    ];
    Ok(BenchReport {
        bench: "seed".to_owned(),
        backend: common.place.backend().to_owned(),
        setup: format!(
            "the seed's Python relay and consumer against entrega's on the same rows: {} outbox \
             events, {} topic messages, {} aggregates; rates over each side's own commit \
             timestamps",
            args.events, args.messages, args.aggregates
        ),
        settings: json!({
            "events": args.events,
            "messages": args.messages,
            "aggregates": args.aggregates,
        }),
        rows,
    })
}

async fn measure(common: &Common, args: &SeedArgs) -> anyhow::Result<Rates> {
    let relays = common.place.fresh();
    let relay_rates = compare_relays(common, &relays, args).await;
    common.cleanup(&relays).await?;
    let (seed_relay, relay) = relay_rates?;
    progress(format!(
        "relay: seed {seed_relay:.0} events/s, entrega {relay:.0} events/s ({:.1}x)",
        relay / seed_relay
    ));
    let consumers = common.place.fresh();
    let consumer_rates = compare_consumers(common, &consumers, args).await;
    common.cleanup(&consumers).await?;
    let (seed_consumer, consumer) = consumer_rates?;
    progress(format!(
        "consumer: seed {seed_consumer:.0} msgs/s, entrega {consumer:.0} msgs/s ({:.1}x)",
        consumer / seed_consumer
    ));
    Ok(Rates {
        seed_relay,
        relay,
        seed_consumer,
        consumer,
    })
}

/// The seed's relay, then entrega's, on the same outbox rows; their events/s.
async fn compare_relays(
    common: &Common,
    run: &BenchRun,
    args: &SeedArgs,
) -> anyhow::Result<(f64, f64)> {
    let pedidos = run.system.pedidos().await.context("opening pedidos")?;
    let Some(pool) = pedidos.db().postgres() else {
        bail!("the seed's relay needs PostgreSQL");
    };
    let broker = run.system.broker().await.context("opening the broker")?;
    let seed_topic = format!("{}.seed", run.topic);
    ensure_topic_and_dlq(&broker, &run.topic).await?;
    ensure_topic_and_dlq(&broker, &seed_topic).await?;
    prefill_outbox(pedidos.db(), &outbox_events(args.events, args.aggregates)?).await?;

    let dsn = run.system.databases().url(&pedidos::DATABASE).await?;
    python(
        common,
        args,
        "seed_relay.py",
        &[
            "--dsn",
            &dsn,
            "--topic",
            &seed_topic,
            "--orders",
            "0",
            "--as-written",
        ],
    )
    .await?;
    let seed = span_rate(pool, "outbox", "publicado_en", None).await?;

    sqlx::query("UPDATE outbox SET publicado_en = NULL")
        .execute(pool)
        .await?;
    // Statistics from before the reset would say nothing is pending; the seed's relay
    // started from a freshly analysed table, so does ours.
    sqlx::query("VACUUM ANALYZE outbox").execute(pool).await?;
    let relay_args = RelayArgs {
        events: args.events,
        aggregates: args.aggregates,
        relays: vec![1],
        batch: 100,
        timeout: args.timeout,
        ..RelayArgs::polling()
    };
    drain_prefilled(run, pedidos.db(), &broker, &relay_args, 1).await?;
    let ours = span_rate(pool, "outbox", "publicado_en", None).await?;
    pedidos.db().close().await;
    broker.close().await;
    Ok((seed, ours))
}

/// entrega's consumer, then the seed's, on the same topic; their messages/s.
async fn compare_consumers(
    common: &Common,
    run: &BenchRun,
    args: &SeedArgs,
) -> anyhow::Result<(f64, f64)> {
    let consume_args = ConsumeArgs {
        messages: args.messages,
        aggregates: args.aggregates,
        batch: 100,
        workers: 1,
        per_event: false,
        timeout: args.timeout,
    };
    consume::drain(run, &consume_args, 1).await?;
    let stock = run.system.inventario().await?;
    let Some(pool) = stock.db().postgres() else {
        bail!("the comparison needs PostgreSQL");
    };
    let ours = span_rate(pool, "mensajes_procesados", "procesado_en", Some(CONSUMER)).await?;
    stock.db().close().await;

    let server = common
        .place
        .postgres_server()
        .context("the comparison needs PostgreSQL")?;
    let name = format!("{}seed", run.system.databases().name(&inventario::DATABASE));
    let dsn = entrega_postgres::ensure_database(server, &name).await?;
    let result = seed_consumer(common, args, run, &dsn).await;
    drop_database(server, &name).await?;
    Ok((result?, ours))
}

/// Runs the seed's consumer on `run.topic` into the database at `dsn`, its stock large enough
/// for every order; its messages/s.
async fn seed_consumer(
    common: &Common,
    args: &SeedArgs,
    run: &BenchRun,
    dsn: &str,
) -> anyhow::Result<f64> {
    let pool = entrega_postgres::connect(dsn).await?;
    // The seed's script creates these tables if missing and keeps rows already there.
    sqlx::query(
        "CREATE TABLE stock (producto TEXT PRIMARY KEY, unidades INTEGER NOT NULL CHECK (unidades >= 0))",
    )
    .execute(&pool)
    .await?;
    for (product, _) in INITIAL_STOCK {
        sqlx::query("INSERT INTO stock VALUES ($1, $2)")
            .bind(product)
            .bind(BENCH_UNITS)
            .execute(&pool)
            .await?;
    }
    let group = format!("{}-seed", run.group);
    let expect = args.messages.to_string();
    let timeout = args.timeout.to_string();
    python(
        common,
        args,
        "seed_consumer.py",
        &[
            "--dsn",
            dsn,
            "--topic",
            &run.topic,
            "--group",
            &group,
            "--expect",
            &expect,
            "--timeout",
            &timeout,
            // The seed's settings and asynchronous commit, as its authors wrote them.
            "--as-written",
        ],
    )
    .await?;
    let rate = span_rate(&pool, "mensajes_procesados", "procesado_en", None).await;
    pool.close().await;
    rate
}

/// Runs `interop/<script>` with the run's Kafka cluster; fails with its stderr's end.
async fn python(
    common: &Common,
    args: &SeedArgs,
    script: &str,
    extra: &[&str],
) -> anyhow::Result<()> {
    let url = common
        .place
        .kafka
        .as_deref()
        .context("the seed's scripts need Kafka")?;
    let bootstrap = entrega_kafka::KafkaConfig::from_url(url)?.bootstrap;
    let run = tokio::process::Command::new(&args.python)
        .arg(args.interop.join(script))
        .args(["--bootstrap", &bootstrap])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(args.timeout), run)
        .await
        .with_context(|| format!("{script} did not finish within {} s", args.timeout))?
        .with_context(|| format!("running {} {script}", args.python))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!("{script} failed ({}): {}", out.status, tail.join(" | "));
    }
    Ok(())
}

/// Rows of `table` divided by the span of their `column` timestamps (only `consumer`'s keys
/// when given), per second.
async fn span_rate(
    pool: &PgPool,
    table: &str,
    column: &str,
    consumer: Option<&str>,
) -> anyhow::Result<f64> {
    let filter = if consumer.is_some() {
        "WHERE consumidor = $1"
    } else {
        "WHERE $1::text IS NULL"
    };
    let sql = format!(
        "SELECT COUNT({column}), \
                EXTRACT(EPOCH FROM max({column}) - min({column}))::float8 \
         FROM {table} {filter}"
    );
    let (rows, span): (i64, Option<f64>) =
        sqlx::query_as(&sql).bind(consumer).fetch_one(pool).await?;
    match span {
        Some(seconds) if rows > 1 && seconds > 0.0 => Ok(rows as f64 / seconds),
        _ => bail!("{table}: {rows} rows with {column}, too few to time"),
    }
}

async fn drop_database(server: &str, name: &str) -> anyhow::Result<()> {
    let admin = entrega_postgres::connect(&with_database(server, "postgres")).await?;
    let sql = format!(
        "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
        name.replace('"', "\"\"")
    );
    let dropped = sqlx::query(&sql).execute(&admin).await;
    admin.close().await;
    dropped?;
    Ok(())
}
