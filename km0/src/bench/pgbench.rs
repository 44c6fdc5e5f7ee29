//! The ceilings: `pgbench` running the engine's own SQL (`bench/pgbench/*.sql`) on a database
//! prefilled exactly like the engine's, with as many clients as the engine has instances.
//!
//! A pgbench client repeats its script until the run is stopped; the scripts idle once there
//! is nothing left, and the harness stops pgbench when the database says the work is done.
//! The end of the work is read from the data (the last mark or offset commit stamps the
//! server's clock), the start is taken right before pgbench is launched, as for the engine.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use entrega::broker::DbLog;
use entrega_core::{now_ms, MigrationSet, TopicAdmin};
use entrega_postgres::PgPool;
use tokio::io::AsyncReadExt as _;
use tokio::process::Command;

use super::workload::{self, BENCH_UNITS};
use super::{progress, Common};
use crate::services::inventario::{BatchMode, StockStore, CONSUMER, GROUP};
use crate::services::pedidos::{PARTITIONS, TOPIC};
use crate::wiring::config::with_database;
use entrega::Db;

/// The relay's statements, one round over the held lanes per transaction.
const RELAY_SCRIPT: &str = include_str!("../../../bench/pgbench/relay.sql");
/// The relay's statements when the events go to Kafka: the read and the fenced mark.
const RELAY_KAFKA_SCRIPT: &str = include_str!("relay_kafka.sql");
/// The consumer's statements, one poll and its batch per transaction; the section between the
/// `@each-message` markers is repeated once per message of a full batch.
const CONSUME_SCRIPT: &str = include_str!("../../../bench/pgbench/consume.sql");
/// The consume ceiling's script for the set-based batch apply.
const CONSUME_SET_SCRIPT: &str = include_str!("../../../bench/pgbench/consume_set.sql");

/// How often the harness asks the database whether the work is done.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// A database of its own for one ceiling run, dropped afterwards.
struct CeilingDb {
    server: String,
    name: String,
    url: String,
    db: Db,
}

impl CeilingDb {
    async fn create(common: &Common) -> anyhow::Result<(Self, PgPool)> {
        let server = common
            .place
            .postgres_server()
            .context("pgbench ceilings need PostgreSQL")?
            .to_owned();
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
        let name = format!("km0bench{id}_ceiling");
        let url = entrega_postgres::ensure_database(&server, &name).await?;
        let db = Db::connect(&url).await?;
        let Some(pool) = db.postgres().cloned() else {
            bail!("the ceiling database is not PostgreSQL");
        };
        Ok((
            Self {
                server,
                name,
                url,
                db,
            },
            pool,
        ))
    }

    async fn drop_database(self, keep: bool) -> anyhow::Result<()> {
        self.db.close().await;
        if keep {
            eprintln!("kept: {}", self.name);
            return Ok(());
        }
        let admin = entrega_postgres::connect(&with_database(&self.server, "postgres")).await?;
        let dropped = sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&admin)
        .await;
        admin.close().await;
        dropped?;
        Ok(())
    }
}

/// One pgbench invocation: script, clients and `-D` variables.
struct Pgbench<'a> {
    binary: &'a str,
    url: &'a str,
    clients: usize,
    vars: Vec<(&'static str, String)>,
}

impl Pgbench<'_> {
    /// Runs `script` until `done_sql` (one boolean) answers true on `pool`, then stops pgbench.
    async fn run_until(
        &self,
        script: &str,
        pool: &PgPool,
        done_sql: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let path =
            std::env::temp_dir().join(format!("km0bench-{}.sql", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, script).context("writing the pgbench script")?;
        let clients = self.clients.max(1).to_string();
        let mut command = Command::new(self.binary);
        command
            .args(["-n", "-M", "prepared", "-t", "1000000000"])
            .args(["-c", &clients, "-j", &clients]);
        for (name, value) in &self.vars {
            command.arg("-D").arg(format!("{name}={value}"));
        }
        command
            .arg("-f")
            .arg(&path)
            .arg(self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", self.binary))?;
        let started = Instant::now();
        let outcome = loop {
            if let Some(status) = child.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr).await;
                }
                break Err(anyhow::anyhow!(
                    "pgbench ended before the work was done ({status}): {stderr}"
                ));
            }
            let done: bool = sqlx::query_scalar(done_sql).fetch_one(pool).await?;
            if done {
                break Ok(());
            }
            if started.elapsed() > timeout {
                break Err(anyhow::anyhow!("pgbench did not finish within {timeout:?}"));
            }
            tokio::time::sleep(CHECK_EVERY).await;
        };
        let _ = child.kill().await;
        let _ = std::fs::remove_file(&path);
        outcome
    }
}

/// Relay ceiling: events/s of pgbench draining `events` prefilled events (over `aggregates`
/// orders) with `clients` clients, each owning `64 / clients` lanes, batches of `batch`.
/// On Kafka the appends go to the cluster, not to the database: the script is the outbox's
/// statements only, the read shipping every column to the client as the relay's does.
pub(crate) async fn relay_ceiling(
    common: &Common,
    binary: &str,
    (events, aggregates, batch): (usize, usize, usize),
    clients: usize,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let kafka = common.place.on_kafka();
    let script = relay_script(kafka);
    let (ceiling, pool) = CeilingDb::create(common).await?;
    let result = async {
        ceiling
            .db
            .migrate(&[MigrationSet::Outbox, MigrationSet::Log])
            .await?;
        DbLog::with_defaults(pool.clone().into())
            .ensure_topic(TOPIC, PARTITIONS)
            .await?;
        workload::prefill_outbox(&ceiling.db, &workload::outbox_events(events, aggregates)?)
            .await?;
        // The lanes held the way `clients` relays would share them.
        sqlx::query(
            "UPDATE entrega_relay_lanes
             SET owner = 'pgbench-' || (lane % $1), token = 1, expires_at_ms = $2",
        )
        .bind(i32::try_from(clients.max(1))?)
        .bind(i64::MAX / 4)
        .execute(&pool)
        .await?;
        let pgbench = Pgbench {
            binary,
            url: &ceiling.url,
            clients,
            vars: vec![
                ("batch", batch.to_string()),
                ("nclients", clients.max(1).to_string()),
            ],
        };
        let start_ms = now_ms();
        pgbench
            .run_until(
                script,
                &pool,
                "SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE publicado_en IS NULL)",
                timeout,
            )
            .await?;
        let end_ms: i64 = sqlx::query_scalar(
            "SELECT (extract(epoch FROM max(publicado_en)) * 1000)::bigint FROM outbox",
        )
        .fetch_one(&pool)
        .await?;
        let appended: i64 = sqlx::query_scalar("SELECT count(*) FROM entrega_log")
            .fetch_one(&pool)
            .await?;
        if !kafka && usize::try_from(appended)? != events {
            bail!("pgbench appended {appended} of {events} events");
        }
        Ok(rate(events, start_ms, end_ms))
    }
    .await;
    ceiling.drop_database(common.keep).await?;
    let rate = result?;
    progress(format!("ceiling x{clients} (pgbench): {rate:.0} events/s"));
    Ok(rate)
}

/// Consume ceiling: msgs/s of one pgbench client running the worker's poll, the consumer's
/// batch transaction and the offset commit over `messages` prefilled messages; `pipelined`
/// sends the batch transaction's statements without waiting for each reply.
pub(crate) async fn consume_ceiling(
    common: &Common,
    binary: &str,
    sizes: (usize, usize, usize),
    pipelined: bool,
    mode: BatchMode,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let (messages, aggregates, batch) = sizes;
    let (ceiling, pool) = CeilingDb::create(common).await?;
    let result = async {
        let stock = StockStore::new(ceiling.db.clone());
        stock.migrate().await?;
        ceiling.db.migrate(&[MigrationSet::Log]).await?;
        workload::fill_stock(&stock).await?;
        let log = DbLog::with_defaults(pool.clone().into());
        log.ensure_topic(TOPIC, PARTITIONS).await?;
        workload::prefill_topic(&log, &workload::topic_messages(TOPIC, messages, aggregates)?).await?;
        workload::settle(&ceiling.db, &["entrega_log"]).await?;
        // One member holding every partition, as a lone worker would after balancing.
        sqlx::query(
            "INSERT INTO entrega_partition_leases (group_id, topic, partition_no, owner, token, expires_at_ms)
             SELECT $1, topic, partition_no, 'pgbench-0', 1, $2 FROM entrega_partitions WHERE topic = $3",
        )
        .bind(GROUP)
        .bind(i64::MAX / 4)
        .bind(TOPIC)
        .execute(&pool)
        .await?;
        let script = consume_script(batch, pipelined, mode);
        let mut vars = vec![
            ("batch", batch.to_string()),
            ("id", "0".to_owned()),
            ("consumer", CONSUMER.to_owned()),
        ];
        let names = ["p0", "p1", "p2", "p3", "p4"];
        for (i, name) in names.iter().enumerate() {
            vars.push((name, workload::product(i).to_owned()));
        }
        for name in ["o0", "o1", "o2", "o3", "o4", "o5"] {
            vars.push((name, "0".to_owned()));
        }
        let pgbench = Pgbench {
            binary,
            url: &ceiling.url,
            clients: 1,
            vars,
        };
        let done = format!(
            "SELECT coalesce(sum(next_offset), 0) >= {messages}
             FROM entrega_group_offsets WHERE group_id = '{GROUP}'"
        );
        let start_ms = now_ms();
        pgbench.run_until(&script, &pool, &done, timeout).await?;
        let end_ms: i64 = sqlx::query_scalar(
            "SELECT max(committed_at_ms) FROM entrega_group_offsets WHERE group_id = $1",
        )
        .bind(GROUP)
        .fetch_one(&pool)
        .await?;
        let claimed: i64 = sqlx::query_scalar("SELECT count(*) FROM mensajes_procesados")
            .fetch_one(&pool)
            .await?;
        let left: Option<i64> = sqlx::query_scalar("SELECT min(unidades)::bigint FROM stock")
            .fetch_one(&pool)
            .await?;
        if usize::try_from(claimed)? != messages || left.is_none_or(|u| u >= i64::from(BENCH_UNITS))
        {
            bail!("pgbench claimed {claimed} of {messages} messages");
        }
        Ok(rate(messages, start_ms, end_ms))
    }
    .await;
    ceiling.drop_database(common.keep).await?;
    let rate = result?;
    let how = if pipelined {
        "pgbench, pipelined"
    } else {
        "pgbench"
    };
    progress(format!("ceiling x1 ({how}): {rate:.0} msgs/s"));
    Ok(rate)
}

/// The relay script: on the log transport the read, the appends and the mark; on Kafka the
/// read (every column to the client) and the mark.
fn relay_script(kafka: bool) -> &'static str {
    if kafka {
        RELAY_KAFKA_SCRIPT
    } else {
        RELAY_SCRIPT
    }
}

/// The consume script for batches of `batch` in `mode`: per event, the per-message section
/// repeated, numbered; and the pipeline markers turned into pgbench's pipeline commands if
/// `pipelined`.
fn consume_script(batch: usize, pipelined: bool, mode: BatchMode) -> String {
    const BEGIN: &str = "-- @each-message\n";
    const END: &str = "-- @end-each-message\n";
    let mut script = match mode {
        BatchMode::SetBased => set_script(),
        BatchMode::PerEvent => {
            let (Some(start), Some(end)) = (CONSUME_SCRIPT.find(BEGIN), CONSUME_SCRIPT.find(END))
            else {
                return CONSUME_SCRIPT.to_owned();
            };
            let section = &CONSUME_SCRIPT[start + BEGIN.len()..end];
            let mut script = CONSUME_SCRIPT[..start].to_owned();
            for k in 1..=batch {
                // Products of message k, like order k of the bench: lines k and k + 1.
                script.push_str(
                    &section
                        .replace("@K@", &k.to_string())
                        .replace("@A@", &(k % 5).to_string())
                        .replace("@B@", &((k + 1) % 5).to_string()),
                );
            }
            script.push_str(&CONSUME_SCRIPT[end + END.len()..]);
            script
        }
    };
    if pipelined {
        script = script
            .replace("-- @pipeline-start\n", "\\startpipeline\n")
            .replace("-- @pipeline-end\n", "\\endpipeline\n");
    }
    script
}

/// `consume_set.sql` with the poll and the offset commit of `consume.sql` in their places.
fn set_script() -> String {
    const POLL: &str = "-- @poll: the poll of consume.sql, unchanged\n";
    const COMMIT: &str = "-- @offset-commit: the offset commit of consume.sql, unchanged\n";
    const END: &str = "-- @pipeline-end\n";
    let poll = CONSUME_SCRIPT
        .find("\\set n 0")
        .zip(CONSUME_SCRIPT.find("-- @pipeline-start"))
        .map_or("", |(a, b)| &CONSUME_SCRIPT[a..b]);
    let commit = CONSUME_SCRIPT
        .find(END)
        .map_or("", |a| &CONSUME_SCRIPT[a + END.len()..]);
    CONSUME_SET_SCRIPT
        .replace(POLL, poll)
        .replace(COMMIT, commit)
}

/// Items per second between two epoch-ms instants.
pub(crate) fn rate(items: usize, start_ms: i64, end_ms: i64) -> f64 {
    let secs = ((end_ms - start_ms).max(1) as f64) / 1000.0;
    items as f64 / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consume_script_repeats_one_section_per_message() {
        let script = consume_script(3, false, BatchMode::PerEvent);
        assert!(!script.contains("@K@"));
        assert!(!script.contains("\n\\startpipeline\n"));
        let piped = consume_script(3, true, BatchMode::PerEvent);
        assert!(piped.contains("\n\\startpipeline\n") && piped.contains("\n\\endpipeline\n"));
        assert!(script.contains(":n >= 3"));
        assert!(!script.contains(":n >= 4"));
        assert_eq!(script.matches("\nWITH lines AS (").count(), 3);
    }

    #[test]
    fn the_set_based_consume_script_is_the_same_whatever_the_batch() {
        let script = consume_script(3, false, BatchMode::SetBased);
        assert_eq!(script, consume_script(500, false, BatchMode::SetBased));
        assert!(!script.contains("@K@") && !script.contains("WITH lines AS ("));
        assert_eq!(
            script.matches("\nINSERT INTO mensajes_procesados").count(),
            1
        );
        assert!(
            script.contains("\\set n 0") && script.contains("INSERT INTO entrega_group_offsets")
        );
        assert!(!script.contains("@poll") && !script.contains("@offset-commit"));
        let piped = consume_script(3, true, BatchMode::SetBased);
        assert!(piped.contains("\n\\startpipeline\n") && piped.contains("\n\\endpipeline\n"));
    }

    #[test]
    fn the_kafka_relay_script_keeps_only_the_outbox_statements() {
        let log = relay_script(false);
        assert!(log.contains("INSERT INTO entrega_log"));
        let kafka = relay_script(true);
        assert!(!kafka.contains("entrega_log") && !kafka.contains("BEGIN;"));
        assert!(kafka.contains("UPDATE outbox SET publicado_en"));
        assert!(kafka.contains("carga::text"), "the rows go to the client");
    }

    #[test]
    fn rates_are_per_second() {
        assert_eq!(rate(1_000, 0, 500), 2_000.0);
        assert_eq!(rate(10, 5, 5), 10_000.0);
    }
}
