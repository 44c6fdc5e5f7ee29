//! `km0 bench saga` on the embedded default, small, with each service a process of its own.
//! Asserted on the report (a saturation, each phase's rate and durations in order, every
//! saga completed, the steps' shares, each process's CPU) and on the run's databases, kept
//! with `--keep`: every order stored went through the whole saga, charged once at the gateway
//! and given one courier.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;

use entrega::db::{query, Db};
use serde_json::Value;

use crate::common::{embedded_km0, report_median};

async fn count(file: &Path, sql: &'static str) -> i64 {
    let db = Db::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let n = db.scalar::<i64>(query(sql)).await.unwrap().unwrap_or(0);
    db.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_saga_is_measured_and_every_order_goes_through_it_once() {
    let dir =
        std::env::temp_dir().join(format!("km0-bench-saga-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = embedded_km0(&dir)
        .args(["bench", "--runs", "1", "--keep", "--json", "saga"])
        .args(["--saturation-seconds", "4", "--in-flight", "8"])
        .args(["--loads", "50", "--rates", "5", "--seconds", "3"])
        .args(["--couriers", "50", "--timeout", "120"])
        .output()
        .expect("run km0 bench saga");
    assert!(
        out.status.success(),
        "km0 bench saga failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    let saturation = report_median(&report, "saturation, sagas completed");
    assert!(saturation > 0.0, "saturation {saturation}");
    for phase in ["50%", "5/s"] {
        let rate = report_median(&report, &format!("at {phase}: rate"));
        assert!(rate > 0.0, "{phase}: rate {rate}");
        let (p50, p99, max) = (
            report_median(&report, &format!("at {phase}: duration p50")),
            report_median(&report, &format!("at {phase}: duration p99")),
            report_median(&report, &format!("at {phase}: duration max")),
        );
        assert!(
            0.0 < p50 && p50 <= p99 && p99 <= max,
            "{phase}: {p50} {p99} {max}"
        );
        assert_eq!(
            report_median(&report, &format!("at {phase}: sagas not completed")),
            0.0
        );
        // The three steps take time (a broker round trip each way); their means add up to
        // no more than the mean saga, which is at most the max.
        let steps: f64 = [
            "reserva (inventario), command to reply",
            "cobro (pagos and the gateway), command to reply",
            "reparto, command to reply",
        ]
        .iter()
        .map(|s| report_median(&report, &format!("at {phase}: {s}")))
        .inspect(|ms| assert!(*ms > 0.0, "{phase}: a step took no time"))
        .sum();
        assert!(
            steps <= max,
            "{phase}: steps {steps} ms beyond the max {max} ms"
        );
        for process in ["pedidos", "relay", "inventario", "pagos", "reparto"] {
            let cpu = report_median(&report, &format!("at {phase}: CPU of {process}"));
            assert!((0.0..=200.0).contains(&cpu), "{process}: {cpu}%");
        }
    }

    // The kept run: every order went through the whole saga, once.
    let run = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.is_dir()
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("demo-saga")
        })
        .expect("the kept run's directory");
    let pedidos = run.join("km0bench_pedidos.db");
    let orders = count(&pedidos, "SELECT COUNT(*) FROM pedidos").await;
    assert!(orders > 0);
    assert_eq!(
        count(
            &pedidos,
            "SELECT COUNT(*) FROM entrega_sagas WHERE state = 'completed'"
        )
        .await,
        orders,
        "every stored order's saga completed"
    );
    assert_eq!(
        count(
            &pedidos,
            "SELECT COUNT(*) FROM pedidos WHERE estado = 'pagado'"
        )
        .await,
        orders
    );
    let gateway = run.join("km0bench_pasarela.db");
    assert_eq!(
        count(&gateway, "SELECT COUNT(DISTINCT referencia) FROM cargos").await,
        orders,
        "each order charged"
    );
    assert_eq!(
        count(&gateway, "SELECT COUNT(*) FROM cargos").await,
        orders,
        "and charged once"
    );
    assert_eq!(
        count(
            &run.join("km0bench_reparto.db"),
            "SELECT COUNT(*) FROM entregas WHERE repartidor_id IS NOT NULL"
        )
        .await,
        orders,
        "each order given a courier"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
