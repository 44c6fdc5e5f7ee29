//! A poison outbox row with real `km0` processes, on SQLite and on PostgreSQL with the log
//! transport: an event routed to a topic that does not exist (`factura` → `facturas.eventos`)
//! is refused by the broker at every attempt and ends held, visible in
//! `km0 outbox status --json` and in the table, while orders placed through the pedidos API
//! flow past it. Releasing an unknown row or a row that is not held fails and changes
//! nothing; once the topic exists, `km0 outbox release <id>` sends the held row and then
//! its aggregate's next event, in order.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::process::Deployment;
use common::state::{count, enqueue, eventually, order, place, DbState};
use entrega_core::{Envelope, NewEvent};
use km0::services::pedidos::TOPIC;
use serde_json::{json, Value};
use uuid::Uuid;

/// The relay holds a row after 5 refusals, 0.1 + 0.2 + 0.4 + 0.8 s of backoff apart.
const HELD_WITHIN: Duration = Duration::from_secs(30);
const MISSING_TOPIC: &str = "facturas.eventos";

/// `id_evento`s on `topic`, in offset order (one partition here, or per partition).
async fn ids_on(state: &DbState, topic: &str) -> Vec<Uuid> {
    if state.end_offsets(topic).await.is_empty() {
        return Vec::new();
    }
    state
        .records(topic)
        .await
        .iter()
        .map(|r| Envelope::parse(&r.payload).unwrap().id)
        .collect()
}

async fn status_json(dep: &Deployment) -> Value {
    let out = dep.cli(&["outbox", "status", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn audit_json(dep: &Deployment) -> Value {
    let out = dep.cli(&["outbox", "audit", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn pending_row(state: &DbState, id: Uuid) -> bool {
    let sql = format!("SELECT COUNT(*) FROM outbox WHERE id = '{id}' AND publicado_en IS NULL");
    count(&state.pedidos, &sql).await == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_refused_for_good_is_held_shown_and_released_while_orders_flow() {
    for backend in ["sqlite", "postgres"] {
        let dep = Deployment::new(backend, 2_000);
        let state = dep.state().await;
        let relay = dep.start("relay", "relay-1").await;
        let pedidos = dep.start("pedidos", "pedidos-1").await;

        let factura = [
            NewEvent::new("factura", "F-1", "factura.emitida", json!({"n": 1})),
            NewEvent::new("factura", "F-1", "factura.anulada", json!({"n": 2})),
        ];
        enqueue(&state.pedidos, &factura).await;
        let mut orders = HashSet::new();
        for i in 0..5 {
            let body = order(&format!("P-{i}"), &[("queso", 1)]);
            orders.insert(place(pedidos.http_addr(), &body).await);
        }

        // The orders go out while the factura row is refused.
        eventually(HELD_WITHIN, "the orders on the topic", || async {
            let seen: HashSet<String> = ids_on(&state, TOPIC)
                .await
                .iter()
                .map(Uuid::to_string)
                .collect();
            orders.is_subset(&seen).then_some(())
        })
        .await;
        let status = eventually(HELD_WITHIN, "the factura row held", || async {
            let status = status_json(&dep).await;
            (status["held"] == 1).then_some(status)
        })
        .await;
        let row = &status["blocked"][0];
        assert_eq!(row["id"], factura[0].id.to_string(), "{backend}: {status}");
        assert_eq!(row["aggregate_id"], "F-1");
        assert_eq!(row["kind"], "factura.emitida");
        assert_eq!(row["attempts"], 5, "{backend}: {status}");
        assert!(row["next_attempt_ms"].is_null());
        assert!(row["held_at_ms"].as_i64().is_some());
        assert!(
            row["last_error"].as_str().unwrap().contains(MISSING_TOPIC),
            "{status}"
        );
        assert_eq!(
            (status["retrying"].as_u64(), status["pending"].as_u64()),
            (Some(0), Some(2))
        );
        // Its aggregate's next event waits behind it.
        assert!(pending_row(&state, factura[1].id).await, "{backend}");
        assert!(ids_on(&state, MISSING_TOPIC).await.is_empty());

        let table = dep.cli(&["outbox", "status"]).await;
        let text = String::from_utf8_lossy(&table.stdout);
        assert!(
            text.contains(&factura[0].id.to_string()) && text.contains("held"),
            "{text}"
        );

        // Releasing an unknown row, or one that is not held, fails and changes nothing.
        let unknown = dep
            .cli(&["outbox", "release", &Uuid::new_v4().to_string()])
            .await;
        assert!(!unknown.status.success());
        assert!(String::from_utf8_lossy(&unknown.stderr).contains("no outbox row"));
        let flowing = orders.iter().next().unwrap();
        let not_parked = dep.cli(&["outbox", "release", flowing]).await;
        assert!(!not_parked.status.success());
        assert!(String::from_utf8_lossy(&not_parked.stderr).contains("is not held"));
        assert_eq!(
            status_json(&dep).await["blocked"],
            status["blocked"],
            "{backend}"
        );
        assert_eq!(
            audit_json(&dep).await,
            json!([]),
            "a refused release was audited"
        );

        // The cause fixed, the row released: it goes out, then its aggregate's next event.
        state
            .broker
            .admin()
            .ensure_topic(MISSING_TOPIC, 1)
            .await
            .unwrap();
        let release = dep
            .cli(&["outbox", "release", &factura[0].id.to_string()])
            .await;
        assert!(release.status.success(), "{release:?}");
        // Audited in pedidos' database, under the user the system says ran it.
        let audit = audit_json(&dep).await;
        let os_user = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        let os_user = String::from_utf8(os_user.stdout).unwrap();
        assert_eq!(audit.as_array().map(Vec::len), Some(1), "{audit}");
        assert_eq!(audit[0]["action"], "outbox_release");
        assert_eq!(audit[0]["operator"], os_user.trim());
        assert_eq!(audit[0]["filter"], format!("--id {}", factura[0].id));
        assert_eq!(
            (audit[0]["applied"].as_u64(), audit[0]["dry_run"].as_bool()),
            (Some(1), Some(false))
        );
        let want = vec![factura[0].id, factura[1].id];
        eventually(HELD_WITHIN, "the factura events published", || async {
            (ids_on(&state, MISSING_TOPIC).await == want).then_some(())
        })
        .await;
        let after = status_json(&dep).await;
        assert_eq!(
            (after["held"].as_u64(), after["pending"].as_u64()),
            (Some(0), Some(0))
        );

        state.close().await;
        relay.terminate().await;
        pedidos.terminate().await;
        dep.destroy().await;
    }
}
