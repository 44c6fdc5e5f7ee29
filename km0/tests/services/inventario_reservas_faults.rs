//! inventario's reservation commands when their transaction fails to commit: nothing of
//! theirs is left (stock, reservation, answer, `stock.actualizado`, key), and the command
//! applies once when delivered again. Failpoints are process-wide and this binary runs other
//! tests of inventario at the same time, so the test runs in a child process of its own (this
//! binary again, asked for this test alone).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use entrega::db::query;
use km0::services::inventario::{
    reservation_id, ReserveCommand, StockLine, StockStore, BEFORE_COMMIT,
};
use uuid::Uuid;

use common::TestDb;

async fn count(t: &TestDb, sql: &'static str) -> i64 {
    t.db.scalar(query(sql)).await.unwrap().unwrap()
}

async fn a_failed_commit_applies_nothing(backend: &str) {
    let t = TestDb::of(backend).await;
    let s = StockStore::new(t.db.clone());
    s.migrate().await.unwrap();
    let reserve = |order: &str, qty: i32| ReserveCommand {
        order_id: order.into(),
        reservation_id: reservation_id(order),
        lines: vec![StockLine {
            product: "calabacin".into(),
            quantity: qty,
        }],
    };
    let id = || Uuid::new_v4().to_string();
    entrega::failpoint::configure(&format!("{BEFORE_COMMIT}=error")).unwrap();
    let failed = s.reserve(&id(), &reserve("P-8", 3)).await;
    entrega::failpoint::configure("").unwrap();
    assert!(failed.unwrap_err().is_transient());
    assert_eq!(s.units("calabacin").await.unwrap(), Some(80));
    assert!(s.reservation("reserva-P-8").await.unwrap().is_none());
    assert_eq!(count(&t, "SELECT COUNT(*) FROM outbox").await, 0);
    assert_eq!(
        count(&t, "SELECT COUNT(*) FROM mensajes_procesados").await,
        0
    );
    s.reserve(&id(), &reserve("P-8", 3)).await.unwrap();
    assert_eq!(s.units("calabacin").await.unwrap(), Some(77));
    let answers =
        t.db.scalar::<i64>(query(
            "SELECT COUNT(*) FROM outbox WHERE tipo = 'reserva.confirmada'",
        ))
        .await
        .unwrap();
    assert_eq!(answers, Some(1));
    t.remove().await;
}

/// Set in the child process, which runs the scenario itself.
const CHILD: &str = "KM0_TEST_FAILPOINT_CHILD";

#[tokio::test]
async fn a_failed_commit_applies_nothing_on_either_backend() {
    if std::env::var_os(CHILD).is_some() {
        a_failed_commit_applies_nothing("sqlite").await;
        a_failed_commit_applies_nothing("postgres").await;
        return;
    }
    let name = "inventario_reservas_faults::a_failed_commit_applies_nothing_on_either_backend";
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
