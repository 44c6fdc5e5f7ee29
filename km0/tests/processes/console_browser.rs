//! The web console in a real browser: `km0 --saga up` with an operator token, driven by
//! headless Chromium (Debian's `chromium`, through `playwright-core` from npm, both installed
//! by `scripts/test`; the script is `tests/console/browser.cjs`).
//!
//! `pedido.creado` records for products inventario does not know are published as another
//! producer would (one for `queso-azul`, 60 for `queso-viejo`), and inventario dead-letters
//! them. `queso-azul` is then added to the stock, and in the browser, 1280 px wide (no page
//! scrolls sideways): the overview lists every service's outbox, marks the groups this
//! deployment does not run, draws its chart and refreshes itself in place as a new order
//! completes; the dead letters are listed 50 a page with their total; the `queso-azul` one is
//! found, a replay without a token is refused, a dry run changes nothing, and the replay by
//! the operator goes through; then the 60 others are discarded at once by their filter, dry
//! run first, then confirmed. Asserted afterwards on the rows: the stock was taken exactly
//! once (and stays so), the marks and the audit hold exactly the operator's actions (the
//! refused attempt left nothing), and a bulk action without the dry run's count, or with a
//! count the selection no longer has, is refused. The browser also opens a completed saga's
//! timeline, the sagas list and the order's trace. Screenshots of each page are kept under
//! the target directory (`console-screenshots/`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use entrega::db::query;
use entrega::headers::ORIGIN_GROUP;
use entrega::saga::SagaStatus;
use entrega::seams::DeadLetterState;
use entrega::MigrationSet;
use km0::services::inventario;
use km0::services::pedidos::TOPIC;
use serde_json::{json, Value};

use common::process::Deployment;
use common::state::{eventually, foreign_order, place};

const TOKEN: &str = "secreto-de-la-prueba";
const UNKNOWN: &str = "queso-azul";
/// Another product inventario does not know, in [`BULK`] more orders.
const WITHDRAWN: &str = "queso-viejo";
/// Dead letters discarded at once from the console: more than one page of its list (50).
const BULK: usize = 60;

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

    // Dead letters: an order for a product inventario does not know, and BULK more for
    // another one (more than a page of the console's list).
    let broker = deployment.system().broker_log().await.unwrap();
    let (event_id, message) = foreign_order("C-DLQ", UNKNOWN, 2);
    let mut messages = vec![message];
    messages.extend((0..BULK).map(|n| foreign_order(&format!("C-BULK-{n}"), WITHDRAWN, 2).1));
    broker.publisher().publish(&messages).await.unwrap();
    let dlq = format!("{TOPIC}.dlq");
    eventually(
        Duration::from_secs(60),
        "inventario dead-letters them all",
        || async {
            let ends = broker.end_offsets(&dlq).await.unwrap();
            let mut keys = std::collections::BTreeSet::new();
            for (partition, end) in ends {
                for r in broker.read(&dlq, partition, 0, end as usize).await.unwrap() {
                    if r.headers.get(ORIGIN_GROUP) == Some(inventario::GROUP) {
                        keys.extend(r.key);
                    }
                }
            }
            (keys.contains("C-DLQ") && keys.len() == BULK + 1).then_some(())
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
    let expected_count = (BULK + 1).to_string();
    assert_eq!(
        counted.and_then(|l| l.rsplit(' ').next()),
        Some(expected_count.as_str()),
        "the dead letters counted: {counted:?}"
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
        .env("PEDIDOS", format!("http://{}", up.http_addr()))
        .env("TOKEN", TOKEN)
        .env("ORDER_DLQ", "C-DLQ")
        .env("ORDER_DLQ_REASON", UNKNOWN)
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
    assert_eq!(seen["operator"], "operator: ana");
    assert!(
        seen["dry_run"].as_str().unwrap().contains("Dry run"),
        "{seen}"
    );
    assert!(
        seen["replay"]
            .as_str()
            .unwrap()
            .starts_with("replay: 1 of 1"),
        "{seen}"
    );
    assert_eq!(seen["saga_state"], "completed");
    // The overview: every outbox, groups this deployment does not run marked, the chart,
    // refreshed in place as the new order completed.
    let services: Vec<&str> = seen["outbox_services"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for service in ["pedidos", "inventario", "pagos", "reparto"] {
        assert!(services.contains(&service), "{service}'s outbox: {seen}");
    }
    // `km0 up` runs every group: each has a live member, none is marked as not running.
    assert_eq!(seen["idle_groups"], 0, "{seen}");
    assert_eq!(seen["running_groups"], seen["lag_rows"], "{seen}");
    assert!(seen["chart_lines"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(seen["auto_refresh"], true, "{seen}");
    assert_eq!(seen["not_reloaded"], true, "{seen}");
    let completed = |k: &str| seen[k].as_str().unwrap().parse::<u64>().unwrap();
    assert_eq!(
        completed("completed_after"),
        completed("completed_before") + 1,
        "{seen}"
    );
    // Paged: 50 of the 61 letters, then the other 11.
    assert_eq!(seen["dlq_total"], (BULK + 1).to_string(), "{seen}");
    assert_eq!(seen["dlq_first_page"], 50, "{seen}");
    assert_eq!(seen["dlq_second_page"], BULK + 1 - 50, "{seen}");
    assert_eq!(
        seen["dlq_second_range"],
        format!("Showing 51 to {} of {}", BULK + 1, BULK + 1),
        "{seen}"
    );
    assert_eq!(seen["held"], "0 held", "{seen}");
    assert_eq!(
        seen["sagas_total"], "2",
        "C-OK and C-LIVE completed: {seen}"
    );
    assert!(
        seen["bulk_dry_run"].as_str().unwrap().starts_with(&format!(
            "Dry run, nothing changed. discard: {BULK} of {BULK}"
        )),
        "{seen}"
    );
    // Cancelled, then held still while the confirmation waited.
    assert_eq!(seen["confirm_after_cancel"], false, "{seen}");
    assert_eq!(seen["held_still"]["confirm"], true, "{seen}");
    assert_eq!(
        seen["held_still"]["reason"], "the products were withdrawn",
        "{seen}"
    );
    assert_eq!(
        seen["held_still"]["stamp"], "paused while an action waits",
        "{seen}"
    );
    assert_eq!(seen["bulk_count"], BULK.to_string(), "{seen}");
    assert!(
        seen["bulk_confirm"]
            .as_str()
            .unwrap()
            .contains(&format!("discard {BULK} of {BULK}")),
        "{seen}"
    );
    assert_eq!(seen["timeline_raw_json"], false, "{seen}");
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
    assert_eq!(marks.len(), BULK + 1, "{marks:?}");
    let replayed: Vec<_> = marks
        .iter()
        .filter(|m| m.state == DeadLetterState::Replayed)
        .collect();
    assert_eq!(replayed.len(), 1, "{marks:?}");
    let discarded = marks
        .iter()
        .filter(|m| {
            m.state == DeadLetterState::Discarded
                && m.reason.as_deref() == Some("the products were withdrawn")
        })
        .count();
    assert_eq!(discarded, BULK, "{marks:?}");
    assert!(marks.iter().all(|m| m.operator == "ana"), "{marks:?}");
    let audit = store.audit(10).await.unwrap();
    let actions: Vec<(String, bool, u64)> = audit
        .iter()
        .map(|e| (e.action.as_str().to_owned(), e.dry_run, e.matched))
        .collect();
    // The discard's dry run twice: once cancelled, once confirmed.
    assert_eq!(audit.len(), 5, "{actions:?}");
    for wanted in [
        ("replay".to_owned(), true, 1),
        ("replay".to_owned(), false, 1),
        ("discard".to_owned(), true, BULK as u64),
        ("discard".to_owned(), false, BULK as u64),
    ] {
        assert!(actions.contains(&wanted), "{wanted:?} in {actions:?}");
    }
    assert!(audit.iter().all(|e| e.operator == "ana"), "{audit:?}");

    // A bulk action must name the count its dry run showed, and is refused when the
    // selection no longer has that many: nothing more is marked or audited.
    let client = reqwest::Client::new();
    let bulk = |body: Value| {
        client
            .post(format!("http://{ops}/console/api/dlq/discard"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    let missing = bulk(json!({"filter": {"failure": "rechazado"}, "reason": "x"}))
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    let changed = bulk(json!({"filter": {"failure": "rechazado"}, "expected": 5, "reason": "x"}))
        .await
        .unwrap();
    assert_eq!(changed.status(), 409);
    let why: Value = changed.json().await.unwrap();
    assert!(
        why["error"]
            .as_str()
            .unwrap()
            .contains("0 dead letters match now, 5 were confirmed"),
        "{why}"
    );
    assert_eq!(store.marks(&dlq).await.unwrap().len(), BULK + 1);
    assert_eq!(store.audit(10).await.unwrap().len(), 5);

    for page in [
        "overview",
        "dead-letters",
        "dead-letter",
        "replay-refused",
        "dead-letter-replayed",
        "bulk-dry-run",
        "dead-letters-after-bulk",
        "saga",
        "sagas",
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
