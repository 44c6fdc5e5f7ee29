//! `km0 bench scale` on the embedded default, small: each stage as one and two `km0 run`
//! processes. Asserted on the report (a rate for every stage and count of processes, a CPU
//! figure for every process) and on the runs' databases, kept with `--keep`: each relay run
//! published its whole backlog, each inventario run applied its whole backlog, each pedidos
//! run stored orders.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;

use entrega::db::{query, Db};
use serde_json::Value;

use crate::common::{embedded_km0, report_median};

const EVENTS: i64 = 600;

/// What one kept run did, read from its databases.
#[derive(Debug, Default, PartialEq)]
struct Run {
    /// Outbox rows, and how many of them were published.
    outbox: (i64, i64),
    /// Keys inventario recorded.
    applied: i64,
    /// Orders pedidos stored.
    orders: i64,
}

/// `sql`'s count in the SQLite database `file`; 0 when the file or the table is not there (a
/// stage's run opens only the databases it needs).
async fn count(file: &Path, sql: &'static str) -> i64 {
    if !file.exists() {
        return 0;
    }
    let db = Db::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let n = db
        .scalar::<i64>(query(sql))
        .await
        .ok()
        .flatten()
        .unwrap_or(0);
    db.close().await;
    n
}

async fn read_run(dir: &Path) -> Run {
    let pedidos = dir.join("pedidos.db");
    let inventario = dir.join("inventario.db");
    Run {
        outbox: (
            count(&pedidos, "SELECT COUNT(*) FROM outbox").await,
            count(
                &pedidos,
                "SELECT COUNT(*) FROM outbox WHERE publicado_en IS NOT NULL",
            )
            .await,
        ),
        applied: count(&inventario, "SELECT COUNT(*) FROM mensajes_procesados").await,
        orders: count(&pedidos, "SELECT COUNT(*) FROM pedidos").await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stage_scales_out_to_processes_that_do_the_work() {
    let dir =
        std::env::temp_dir().join(format!("km0-bench-scale-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = embedded_km0(&dir)
        .args(["bench", "--runs", "1", "--keep", "--json", "scale"])
        .args(["--events", &EVENTS.to_string(), "--aggregates", "30"])
        .args(["--instances", "1,2", "--seconds", "2", "--clients", "4"])
        .args(["--timeout", "120"])
        .output()
        .expect("run km0 bench scale");
    assert!(
        out.status.success(),
        "km0 bench scale failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    for stage in ["relay", "inventario", "pedidos"] {
        for k in 1..=2 {
            let rate = report_median(&report, &format!("{stage} x{k}"));
            assert!(rate > 0.0, "{stage} x{k}: rate {rate}");
            for i in 1..=k {
                let cpu = report_median(&report, &format!("{stage} x{k}: CPU of {stage}-{i}"));
                assert!((0.0..=200.0).contains(&cpu), "{stage}-{i} of {k}: {cpu}%");
            }
        }
        // One process alone did all the work: it used the CPU.
        let alone = report_median(&report, &format!("{stage} x1: CPU of {stage}-1"));
        assert!(alone > 0.0, "{stage} x1 used no CPU");
    }

    // Six runs kept, each in a directory of its own: two of each stage, each done.
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            runs.push(read_run(&path).await);
        }
    }
    let relay = runs
        .iter()
        .filter(|r| r.outbox == (EVENTS, EVENTS) && r.orders == 0)
        .count();
    let inventario = runs
        .iter()
        .filter(|r| r.applied == EVENTS && r.outbox.0 == 0)
        .count();
    let pedidos = runs
        .iter()
        .filter(|r| r.orders > 0 && r.outbox.1 == 0)
        .count();
    assert_eq!(
        (runs.len(), relay, inventario, pedidos),
        (6, 2, 2, 2),
        "runs: {runs:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
