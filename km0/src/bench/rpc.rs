//! `km0 bench rpc`: request/reply on RabbitMQ, round trip with one call in flight (p50, p99)
//! and calls/s with many in flight, pagos doing its real idempotent work (each authorisation
//! applied and its answer stored in pagos' database) against the seed's client and the
//! trivial responder a user would write with pika (`interop/bench_rpc.py`), same broker, one
//! run after the other on `pagos.autorizaciones`.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use entrega::rpc::{RpcClient, RpcServer, RpcServerConfig, StoredAnswers};
use entrega::CancellationToken;
use serde_json::json;
use tokio::io::AsyncBufReadExt as _;

use super::report::{BenchReport, Measurement, Target};
use super::Common;
use crate::services::pagos::{server_config, Authoriser, AUTHORISATIONS, AUTHORISER};
use crate::services::pedidos::PARTITIONS;
use crate::wiring::System;

/// Our p99 with one call in flight must be at most this multiple of the baseline's.
const TARGET_P99_RATIO: f64 = 1.0;
/// Our calls/s with many in flight must be at least this multiple of the baseline's.
const TARGET_RATE_RATIO: f64 = 10.0;
/// Calls before measuring, on each side.
const WARM_UP: usize = 50;

/// `km0 bench rpc`.
#[derive(Debug, Clone, Args)]
pub struct RpcArgs {
    /// Calls made one at a time, for the latency figures.
    #[arg(long, default_value_t = 500)]
    pub latency_calls: usize,
    /// Calls made with `--inflight` in flight, for the throughput figures.
    #[arg(long, default_value_t = 5_000)]
    pub calls: usize,
    /// Calls in flight at once for the throughput figures (the baseline runs this many client
    /// processes: the seed's client waits for each reply).
    #[arg(long, default_value_t = 64)]
    pub inflight: usize,
    /// The Python with pika (`scripts/lib/python.sh` makes one).
    #[arg(long, env = "KM0_INTEROP_PYTHON", default_value = "python3")]
    pub python: String,
    /// Where the seed's scripts are.
    #[arg(long, default_value = "interop")]
    pub interop: PathBuf,
    /// Seconds one phase may take before the run fails.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// One side's figures of one run.
struct Side {
    p50_ms: f64,
    p99_ms: f64,
    calls_per_s: f64,
    /// Requests per batch handed to the server's handler (entrega's server only).
    per_batch: f64,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn side(mut latencies: Vec<f64>, calls: usize, seconds: f64) -> Side {
    latencies.sort_by(f64::total_cmp);
    Side {
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        calls_per_s: if seconds > 0.0 {
            calls as f64 / seconds
        } else {
            0.0
        },
        per_batch: 0.0,
    }
}

/// Runs the bench against the RabbitMQ of `broker` (the seed's client connects to
/// `localhost`, so it must be the local broker's default virtual host).
pub(crate) async fn run(
    common: &Common,
    broker: &str,
    args: &RpcArgs,
) -> anyhow::Result<BenchReport> {
    let mut ours = Vec::new();
    let mut trivial = Vec::new();
    let mut baseline = Vec::new();
    for n in 0..common.runs {
        eprintln!(
            "run {}/{}: the seed's client and a trivial responder",
            n + 1,
            common.runs
        );
        baseline.push(seed_side(args).await?);
        eprintln!("run {}/{}: entrega's client and pagos", n + 1, common.runs);
        ours.push(our_side(common, broker, args, Server::Pagos).await?);
        eprintln!(
            "run {}/{}: entrega's client and a trivial server",
            n + 1,
            common.runs
        );
        trivial.push(our_side(common, broker, args, Server::Trivial).await?);
    }
    let pick = |sides: &[Side], f: fn(&Side) -> f64| sides.iter().map(f).collect::<Vec<_>>();
    let ratio = |a: &[Side], b: &[Side], f: fn(&Side) -> f64| {
        a.iter()
            .zip(b)
            .map(|(x, y)| if f(y) > 0.0 { f(x) / f(y) } else { 0.0 })
            .collect()
    };
    let inflight = args.inflight;
    let rows = vec![
        Measurement::new(
            "p50, 1 in flight (entrega + pagos)",
            "ms",
            pick(&ours, |s| s.p50_ms),
        ),
        Measurement::new(
            "p50, 1 in flight (seed client + trivial responder)",
            "ms",
            pick(&baseline, |s| s.p50_ms),
        ),
        Measurement::new(
            "p99, 1 in flight (entrega + pagos)",
            "ms",
            pick(&ours, |s| s.p99_ms),
        ),
        Measurement::new(
            "p99, 1 in flight (seed client + trivial responder)",
            "ms",
            pick(&baseline, |s| s.p99_ms),
        ),
        Measurement::new(
            "p99 entrega / baseline",
            "x",
            ratio(&ours, &baseline, |s| s.p99_ms),
        )
        .with_target(|m| Target::at_most(TARGET_P99_RATIO, m)),
        Measurement::new(
            format!("calls/s, {inflight} in flight (entrega + pagos)"),
            "calls/s",
            pick(&ours, |s| s.calls_per_s),
        ),
        Measurement::new(
            format!("calls/s, {inflight} in flight (seed client + trivial responder)"),
            "calls/s",
            pick(&baseline, |s| s.calls_per_s),
        ),
        Measurement::new(
            "calls/s entrega / baseline",
            "x",
            ratio(&ours, &baseline, |s| s.calls_per_s),
        )
        .with_target(|m| Target::at_least(TARGET_RATE_RATIO, m)),
        Measurement::new(
            format!("requests per batch, {inflight} in flight (pagos)"),
            "requests",
            pick(&ours, |s| s.per_batch),
        ),
        Measurement::new(
            "p50, 1 in flight (entrega + trivial server)",
            "ms",
            pick(&trivial, |s| s.p50_ms),
        ),
        Measurement::new(
            "p99, 1 in flight (entrega + trivial server)",
            "ms",
            pick(&trivial, |s| s.p99_ms),
        ),
        Measurement::new(
            format!("calls/s, {inflight} in flight (entrega + trivial server)"),
            "calls/s",
            pick(&trivial, |s| s.calls_per_s),
        ),
    ];
    Ok(BenchReport {
        bench: "rpc".into(),
        backend: format!("{} + rabbitmq", common.place.backend()),
        setup: format!(
            "{} calls one at a time, {} calls with {inflight} in flight, per side; entrega: one \
             RpcClient, pagos' RpcServer answering through StoredAnswers in its database; \
             baseline: the seed's cliente_pagos_rpc.py (one process per call in flight) and a \
             trivial pika responder",
            args.latency_calls, args.calls
        ),
        settings: json!({
            "latency_calls": args.latency_calls, "calls": args.calls, "inflight": inflight,
            "runs": common.runs,
        }),
        rows,
    })
}

/// Which server answers entrega's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    /// pagos' authorisations, stored with their answers in its database.
    Pagos,
    /// An answer made in memory: what the transport alone costs.
    Trivial,
}

/// Answers every request with a constant body, touching no database.
struct TrivialAnswer;

#[async_trait::async_trait]
impl entrega::rpc::RpcHandler for TrivialAnswer {
    async fn answer(
        &self,
        _request: &entrega_core::RpcMessage,
    ) -> Result<Vec<u8>, entrega_core::HandlerError> {
        Ok(br#"{"autorizado":true,"id_autorizacion":"AUT-trivial"}"#.to_vec())
    }
}

/// entrega's client against `which` server (pagos on a fresh pagos database, or the trivial
/// one).
async fn our_side(
    common: &Common,
    broker: &str,
    args: &RpcArgs,
    which: Server,
) -> anyhow::Result<Side> {
    let fresh = common.place.fresh();
    let system = System::new(fresh.system.databases().clone(), broker.to_owned());
    let store = system
        .pagos()
        .await
        .context("opening a fresh pagos database")?;
    let broker = system.broker().await.context("opening the broker")?;
    let handler: Arc<dyn entrega::rpc::RpcHandler> = match which {
        Server::Pagos => Arc::new(StoredAnswers::new(
            store.db().clone(),
            AUTHORISER,
            Authoriser,
        )),
        Server::Trivial => Arc::new(TrivialAnswer),
    };
    let mut config = match which {
        Server::Pagos => server_config(store.db()),
        Server::Trivial => RpcServerConfig::new(AUTHORISATIONS),
    };
    config.concurrency = args.inflight.max(1);
    let server = RpcServer::new(broker.rpc(PARTITIONS), handler, config);
    let served = server.stats();
    let stop = CancellationToken::new();
    let serving = tokio::spawn({
        let stop = stop.clone();
        async move { server.run(stop).await }
    });
    let client = Arc::new(RpcClient::start(broker.rpc(PARTITIONS)).await?);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let call = |client: Arc<RpcClient>, id: String, n: usize| async move {
        let body = json!({"pedido_id": id, "importe_centimos": 1000 + n}).to_string();
        client
            .call(AUTHORISATIONS, body.into_bytes(), Duration::from_secs(30))
            .await
    };
    for n in 0..WARM_UP {
        call(client.clone(), format!("W-{run}-{n}"), n).await?;
    }
    let mut latencies = Vec::with_capacity(args.latency_calls);
    for n in 0..args.latency_calls {
        let started = Instant::now();
        call(client.clone(), format!("L-{run}-{n}"), n).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let (answered_before, batches_before) = (served.answered(), served.batches());
    let started = Instant::now();
    let per_task = args.calls.div_ceil(args.inflight.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..args.inflight.max(1) {
        let (client, run) = (client.clone(), run.clone());
        let count = per_task.min(args.calls.saturating_sub(t * per_task));
        tasks.spawn(async move {
            for i in 0..count {
                call(client.clone(), format!("T-{run}-{t}-{i}"), i).await?;
            }
            Ok::<usize, entrega::rpc::RpcError>(count)
        });
    }
    let mut done = 0;
    while let Some(joined) = tasks.join_next().await {
        done += joined.context("a calling task")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let batches = served.batches().saturating_sub(batches_before);
    let per_batch =
        served.answered().saturating_sub(answered_before) as f64 / batches.max(1) as f64;
    stop.cancel();
    serving.await.context("the server task")??;
    drop(client);
    broker.close().await;
    store.db().close().await;
    common.cleanup(&fresh).await?;
    let mut figures = side(latencies, done, seconds);
    figures.calls_per_s = done as f64 / seconds.max(f64::MIN_POSITIVE);
    figures.per_batch = per_batch;
    Ok(figures)
}

/// The seed's client against the trivial responder.
async fn seed_side(args: &RpcArgs) -> anyhow::Result<Side> {
    let mut responder = tokio::process::Command::new(&args.python)
        .arg(args.interop.join("bench_rpc.py"))
        .arg("responder")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {} bench_rpc.py responder", args.python))?;
    let stdout = responder.stdout.take().context("the responder's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
        Ok(Ok(Some(line))) if line.trim() == "listo" => {}
        other => bail!("the trivial responder did not start: {other:?}"),
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    clients(args, WARM_UP, 1, &format!("W-{run}")).await?;
    let (latencies, _, _) = clients(args, args.latency_calls, 1, &format!("L-{run}")).await?;
    let (_, calls, seconds) = clients(args, args.calls, args.inflight, &format!("T-{run}")).await?;
    responder
        .kill()
        .await
        .context("stopping the trivial responder")?;
    let mut figures = side(latencies, calls, seconds);
    figures.calls_per_s = calls as f64 / seconds.max(f64::MIN_POSITIVE);
    Ok(figures)
}

/// `bench_rpc.py clients`: the latencies, the calls answered and the seconds they took.
async fn clients(
    args: &RpcArgs,
    calls: usize,
    inflight: usize,
    prefix: &str,
) -> anyhow::Result<(Vec<f64>, usize, f64)> {
    // Run from the scripts' directory, so `import cliente_pagos_rpc` finds the seed's client.
    let run = tokio::process::Command::new(&args.python)
        .arg("bench_rpc.py")
        .args(["clients", "--calls", &calls.to_string()])
        .args(["--inflight", &inflight.to_string(), "--prefijo", prefix])
        .current_dir(&args.interop)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(args.timeout), run)
        .await
        .with_context(|| format!("the seed's clients took more than {} s", args.timeout))?
        .context("running bench_rpc.py clients")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "bench_rpc.py clients failed ({}): {}",
            out.status,
            tail.join(" | ")
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .context("bench_rpc.py printed no summary")?;
    let latencies = summary["latencias_ms"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
        .unwrap_or_default();
    let calls = summary["calls"].as_u64().unwrap_or(0);
    Ok((
        latencies,
        usize::try_from(calls).unwrap_or(0),
        summary["seconds"].as_f64().unwrap_or(0.0),
    ))
}
