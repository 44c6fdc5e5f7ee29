//! The web console in a real browser: `km0 --saga up` with an operator token, driven by
//! headless Chromium (Debian's `chromium`, through `playwright-core` from npm, both installed
//! by `scripts/test`; the script is `tests/console/browser.cjs`).
//!
//! A `pedido.creado` for a product inventario does not know is published as another producer
//! would, and inventario dead-letters it. The product is then added to the stock, and in the
//! browser: the dead letter is found in the list (class and code shown), a replay without a
//! token is refused, a dry run changes nothing, and the replay by the operator goes through.
//! Asserted afterwards on the rows: the stock was taken exactly once (and stays so), the
//! dead letter is marked replayed by that operator, and the audit holds the dry run and the
//! replay and nothing for the refused attempt. The browser also opens a completed saga's
//! timeline and the order's trace. Screenshots of each page are kept under the target
//! directory (`console-screenshots/`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use entrega::db::query;
use entrega::headers::{ID_EVENTO, ORIGIN_GROUP, TIPO};
use entrega::saga::SagaStatus;
use entrega::seams::DeadLetterState;
use entrega::{Headers, MigrationSet, OutgoingMessage};
use km0::services::inventario;
use km0::services::pedidos::TOPIC;
use serde_json::{json, Value};

use common::process::Deployment;
use common::state::{eventually, place};

const TOKEN: &str = "secreto-de-la-prueba";
const UNKNOWN: &str = "queso-azul";

fn tool(var: &str, default: PathBuf) -> PathBuf {
    let path = std::env::var_os(var).map_or(default, PathBuf::from);
    assert!(
        path.exists(),
        "{} not found ({var}); scripts/test installs the browser tools",
        path.display()
    );
    path
}

async fn units(db: &entrega::Db, product: &str) -> Option<i64> {
    db.scalar(query("SELECT CAST(unidades AS BIGINT) FROM stock WHERE producto = $1").bind(product))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_from_the_console_and_applied_once() {
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let modules = tool(
        "KM0_NODE_MODULES",
        home.join(".cache/km0/playwright-1.64.1/node_modules"),
    );
    let chromium = tool("KM0_CHROMIUM", PathBuf::from("/usr/bin/chromium"));
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();

    let deployment = Deployment::new("sqlite", 1_000);
    let token = format!("ana:{TOKEN}");
    let (up, ops) = deployment
        .start_up("up-1", &["--saga", "--console-token", &token])
        .await;

    // A saga to look at.
    place(
        up.http_addr(),
        &json!({"id": "C-OK", "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
                "lineas": [{"producto": "queso-fresco", "cantidad": 1, "precio_centimos": 600}],
                "direccion_entrega": {"ciudad": "Madrid", "codigo_postal": "28013", "calle": "Carrer Major 3"}}),
    )
    .await;
    let orders = deployment.system().pedidos().await.unwrap();
    let sagas = deployment.system().sagas(&orders).await.unwrap();
    eventually(Duration::from_secs(60), "the saga completes", || async {
        let (saga, _) = sagas.show("C-OK").await.unwrap()?;
        (saga.status == SagaStatus::Completed).then_some(())
    })
    .await;

    // A dead letter: an order for a product inventario does not know.
    let broker = deployment.system().broker_log().await.unwrap();
    let event_id = uuid::Uuid::new_v4().to_string();
    let envelope = json!({"id_evento": event_id, "tipo": "pedido.creado", "version": 1,
        "fecha_ms": 1_764_000_000_000i64, "origen": "tienda-externa",
        "datos": {"id": "C-DLQ", "cliente": "ana", "mercado": "girona",
                  "lineas": [{"producto": UNKNOWN, "cantidad": 2, "precio_centimos": 900}]}});
    broker
        .publisher()
        .publish(&[OutgoingMessage {
            topic: TOPIC.to_owned(),
            key: Some("C-DLQ".to_owned()),
            headers: Headers::new()
                .with(TIPO, "pedido.creado")
                .with(ID_EVENTO, event_id.clone()),
            payload: serde_json::to_vec(&envelope).unwrap(),
        }])
        .await
        .unwrap();
    let dlq = format!("{TOPIC}.dlq");
    eventually(
        Duration::from_secs(30),
        "inventario dead-letters it",
        || async {
            let ends = broker.end_offsets(&dlq).await.unwrap();
            for (partition, end) in ends {
                for r in broker.read(&dlq, partition, 0, end as usize).await.unwrap() {
                    if r.key.as_deref() == Some("C-DLQ")
                        && r.headers.get(ORIGIN_GROUP) == Some(inventario::GROUP)
                    {
                        return Some(());
                    }
                }
            }
            None
        },
    )
    .await;
    // Counted by its kind of failure and the handler's code.
    let metrics = reqwest::get(format!("http://{ops}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics.lines().find(|l| {
        l.starts_with("entrega_dead_letters_total{")
            && l.contains("class=\"rechazado\"")
            && l.contains("group=\"inventario\"")
            && l.contains("reason=\"producto_desconocido\"")
    });
    assert_eq!(
        counted.and_then(|l| l.rsplit(' ').next()),
        Some("1"),
        "the dead letter counted: {counted:?}"
    );
    // The cause is fixed: the product exists now.
    let stock = deployment
        .system()
        .databases()
        .connect(&km0::services::inventario::DATABASE)
        .await
        .unwrap();
    stock
        .execute(query("INSERT INTO stock (producto, unidades) VALUES ($1, 10)").bind(UNKNOWN))
        .await
        .unwrap();

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/console/browser.cjs");
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .env("CONSOLE", format!("http://{ops}/console"))
        .env("TOKEN", TOKEN)
        .env("ORDER_DLQ", "C-DLQ")
        .env("ORDER_SAGA", "C-OK")
        .env("SHOTS", &shots)
        .env("KM0_CHROMIUM", &chromium)
        .env("KM0_NODE_MODULES", &modules)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the browser script finished within 3 minutes")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "browser: {stdout}\n{stderr}\nscreenshots in {}",
        shots.display()
    );
    assert!(
        output.status.success(),
        "the browser script failed: {stderr}"
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap();
    assert!(
        seen["without_token"].as_str().unwrap().contains("401"),
        "{seen}"
    );
    assert_eq!(seen["operator"], "operador: ana");
    assert!(
        seen["dry_run"].as_str().unwrap().contains("Ensayo"),
        "{seen}"
    );
    assert_eq!(seen["saga_state"], "completed");
    assert_eq!(
        seen["trace_ids"].as_array().unwrap().len(),
        1,
        "one trace: {seen}"
    );
    for service in ["pedidos", "inventario", "pagos", "reparto"] {
        assert!(
            seen["trace_services"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == service),
            "{service} in the trace: {seen}"
        );
    }

    // The replay applied the order once, and only once.
    eventually(
        Duration::from_secs(30),
        "the replayed order takes its stock",
        || async { (units(&stock, UNKNOWN).await == Some(8)).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(units(&stock, UNKNOWN).await, Some(8), "taken once");
    let keys: i64 = stock
        .scalar(
            query("SELECT COUNT(*) FROM mensajes_procesados WHERE id_mensaje = $1 AND consumidor = $2")
                .bind(&event_id)
                .bind(inventario::CONSUMER),
        )
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(keys, 1);

    // Marked and audited under the token's operator; the refused attempt left nothing.
    stock.migrate(&[MigrationSet::Dlq]).await.unwrap();
    let store = stock.dead_letters();
    let marks = store.marks(&dlq).await.unwrap();
    assert_eq!(marks.len(), 1, "{marks:?}");
    assert_eq!(marks[0].state, DeadLetterState::Replayed);
    assert_eq!(marks[0].operator, "ana");
    let audit = store.audit(10).await.unwrap();
    let dry: Vec<bool> = audit.iter().map(|e| e.dry_run).collect();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(dry.contains(&true) && dry.contains(&false), "{audit:?}");
    assert!(audit.iter().all(|e| e.operator == "ana"), "{audit:?}");

    for page in [
        "overview",
        "dead-letters",
        "dead-letter",
        "replay-refused",
        "dead-letter-replayed",
        "saga",
        "trace",
    ] {
        let file = shots.join(format!("{page}.png"));
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        assert!(
            size > 1_000,
            "screenshot {} missing or empty",
            file.display()
        );
    }
    stock.close().await;
    deployment.destroy().await;
}
