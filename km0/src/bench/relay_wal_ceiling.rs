//! The WAL ceiling: PostgreSQL's own `pg_recvlogical` draining the same backlog from a
//! `pgoutput` slot of the same publication (binary tuples, the same connection settings) and
//! throwing it away. It is what this server's walsender delivers to a client that does no
//! work at all: no broker, no mark. No WAL relay can drain faster.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use entrega::db::query;
use entrega::Db;
use entrega_postgres::wal::slot::PUBLICATION;

use super::relay::RelayArgs;
use super::workload::{outbox_events, prefill_outbox};
use super::BenchRun;
use crate::services::pedidos;

/// Events/s at which `binary` (`pg_recvlogical`) drains the run's backlog, written after its
/// slot was made, as the WAL relay's is.
pub(crate) async fn drain(run: &BenchRun, args: &RelayArgs, binary: &str) -> anyhow::Result<f64> {
    let pedidos = run.system.pedidos().await.context("opening pedidos")?;
    let result = drain_in(run, pedidos.db(), args, binary).await;
    pedidos.db().close().await;
    result
}

async fn drain_in(run: &BenchRun, db: &Db, args: &RelayArgs, binary: &str) -> anyhow::Result<f64> {
    let url = run.system.databases().existing_url(&pedidos::DATABASE);
    let slot = format!(
        "km0bench_ceiling_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    db.execute(query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')").bind(&slot))
        .await
        .context("creating the ceiling's slot")?;
    let drained = async {
        prefill_outbox(db, &outbox_events(args.events, args.aggregates)?).await?;
        let end: Option<String> = db
            .scalar(query("SELECT pg_current_wal_lsn()::text"))
            .await?;
        let end = end.context("no WAL position")?;
        let started = Instant::now();
        let mut child = tokio::process::Command::new(binary)
            .args(["--dbname", &url, "--slot", &slot, "--start", "--no-loop"])
            .args([
                "--endpos",
                &end,
                "--file",
                "/dev/null",
                "--plugin",
                "pgoutput",
            ])
            .args(["--option", "proto_version=1", "--option", "binary=true"])
            .arg("--option")
            .arg(format!("publication_names={PUBLICATION}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {binary} (--pg-recvlogical)"))?;
        let status = tokio::time::timeout(Duration::from_secs(args.timeout), child.wait())
            .await
            .context("pg_recvlogical did not finish within the timeout")??;
        let seconds = started.elapsed().as_secs_f64();
        if !status.success() {
            let output = child.wait_with_output().await?;
            bail!(
                "{binary} failed ({status}): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok::<f64, anyhow::Error>(args.events as f64 / seconds.max(1e-6))
    }
    .await;
    drop_slot(db, &slot).await?;
    drained
}

/// Drops `slot`, waiting while its sender lets it go (SQLSTATE 55006 right after the client
/// exits).
async fn drop_slot(db: &Db, slot: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dropped = db
            .execute(query("SELECT pg_drop_replication_slot($1)").bind(slot))
            .await;
        match dropped {
            Ok(_) => return Ok(()),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).context("dropping the ceiling's slot"),
        }
    }
}
