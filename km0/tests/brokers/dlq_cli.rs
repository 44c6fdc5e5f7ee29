//! `km0 dlq` as a process, on the log transport (SQLite) and on an Apache Kafka broker of its own.
//!
//! The inventario consumer runs in the test process and dead-letters order events it cannot
//! apply (an unknown product, an unknown `tipo`). Then each command runs as `km0` would be
//! run by an operator, and the test checks what it printed against the truth read
//! independently: records on the broker, rows of `entrega_dlq_state`/`entrega_dlq_audit`,
//! stock and processed-message rows of inventario's database.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use serde_json::Value;

use crate::dlq_steps::Deployment;
use common::kafka_ns::KafkaNamespace;

/// The whole procedure: examine, refuse bad requests, dry run, discard, fix and replay, the
/// loop guard, a replay to one group only, and the audit of it all.
async fn tend_the_dead_letters(broker_url: &str, patience: Duration) {
    let d = Deployment::start(broker_url, patience).await;
    let a = d.order("PA", "pedido.creado", "queso-azul", 2).await;
    let b = d.order("PB", "pedido.creado", "queso-azul", 1).await;
    let c = d.order("PC", "pedido.extraviado", "tomate-rosa", 1).await;
    let t = d.order("PD", "pedido.creado", "trufa", 1).await;
    d.wait_dead_letters(4).await;

    // Examine: every dead letter with where it sits, why, and how often it was tried.
    let listed = d.json(&["dlq", "list", "--json"]).await;
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 4, "{listed:#}");
    let row_a = d.row_of(&listed, &a);
    assert_eq!(row_a["key"], "PA");
    assert_eq!(row_a["tipo"], "pedido.creado");
    assert_eq!(
        row_a["motivo"],
        "permanent: producto desconocido: queso-azul"
    );
    assert_eq!(row_a["class"], "permanent: producto desconocido");
    assert_eq!(row_a["attempts"], 1);
    assert_eq!(row_a["replays"], 0);
    assert_eq!(row_a["state"], "pending");
    assert_eq!(row_a["origin"]["topic"], "pedidos.eventos");
    assert_eq!(row_a["origin"]["group"], "inventario");
    assert_eq!(row_a["topic"], "pedidos.eventos.dlq");
    let record = d.dead_letter_record(&row_a).await;
    assert_eq!(record.key.as_deref(), Some("PA"), "the id names the record");
    let row_c = d.row_of(&listed, &c);
    assert_eq!(row_c["motivo"], "unknown tipo `pedido.extraviado`");
    let id = |row: &Value| row["id"].as_str().unwrap().to_owned();
    let (id_a, id_c, id_t) = (id(&row_a), id(&row_c), id(&d.row_of(&listed, &t)));

    let stats = d.json(&["dlq", "stats", "--json"]).await;
    let topic = &stats["topics"][0];
    assert_eq!(
        (topic["pending"].as_u64(), topic["total"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(
        topic["by_class"][0]["motivo"],
        "permanent: producto desconocido"
    );
    assert_eq!(topic["by_class"][0]["pending"], 3);
    assert_eq!(topic["by_class"][1]["motivo"], "unknown tipo");
    assert_eq!(topic["retry"]["depth"], 0);
    let shown = d.json(&["dlq", "show", &id_a, "--json"]).await;
    assert_eq!(shown["envelope"]["id_evento"], a.to_string());
    assert_eq!(shown["history"].as_array().unwrap().len(), 1);

    // Bad requests: exit code 2, a clear message, nothing changed (not even the audit).
    let before = d.snapshot().await;
    let unknown = "pedidos.eventos.dlq/0/999";
    for (args, says) in [
        (
            vec!["replay", "--id", &id_a, "--tipo", "pedido.creado"],
            "cannot be combined",
        ),
        (
            vec!["replay", "--id", unknown],
            "no dead letter pedidos.eventos.dlq/0/999",
        ),
        (vec!["show", unknown], "no dead letter"),
        (
            vec!["list", "--since", "1h", "--until", "2h"],
            "is after --until",
        ),
        (vec!["discard", "--id", &id_c], "--reason"),
        (
            vec!["discard", "--id", &id_c, "--reason", " "],
            "needs a reason",
        ),
        (
            vec!["replay", "--id", "pedidos.eventos.dlq/x"],
            "invalid dead-letter id",
        ),
    ] {
        let (code, _, stderr) = d.km0(&[&["dlq"], args.as_slice()].concat()).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: `{stderr}` lacks `{says}`");
    }
    assert_eq!(
        d.snapshot().await,
        before,
        "a refused request changed something"
    );

    // A dry run prints what would happen and changes nothing but the audit.
    let dry = d
        .json(&["dlq", "replay", "--motivo", "queso", "--dry-run", "--json"])
        .await;
    assert_eq!(dry["applied"].as_array().unwrap().len(), 2);
    let mut expected = before.clone();
    expected.audit_rows += 1;
    assert_eq!(
        d.snapshot().await,
        expected,
        "the dry run changed something"
    );

    // Discard needs a reason and hides the dead letter.
    let discard = [
        "dlq",
        "discard",
        "--id",
        &id_c,
        "--reason",
        "tipo retirado",
        "--json",
    ];
    assert_eq!(
        d.json(&discard).await["applied"].as_array().unwrap().len(),
        1
    );
    assert_eq!(
        d.json(&["dlq", "list", "--json"])
            .await
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let all = d.json(&["dlq", "list", "--all", "--json"]).await;
    let gone = d.row_of(&all, &c);
    assert_eq!(
        (gone["state"].as_str(), gone["reason"].as_str()),
        (Some("discarded"), Some("tipo retirado"))
    );

    // Fix the cause, then replay: each order is applied once, and only once.
    d.add_product("queso-azul", 10).await;
    let replayed = d
        .json(&["dlq", "replay", "--motivo", "queso-azul", "--json"])
        .await;
    assert_eq!(
        replayed["applied"].as_array().unwrap().len(),
        2,
        "{replayed:#}"
    );
    d.wait_caught_up().await;
    assert_eq!(
        d.stock("queso-azul").await,
        Some(7),
        "2 + 1 units taken once"
    );
    assert_eq!(d.keys_of(&a).await, 1);
    assert_eq!(d.keys_of(&b).await, 1);
    assert_eq!(
        d.snapshot().await.dead_letters,
        4,
        "a fixed replay dead-lettered again"
    );
    let before = d.snapshot().await;
    let again = d
        .json(&["dlq", "replay", "--motivo", "queso-azul", "--json"])
        .await;
    assert_eq!(again["matched"], 0, "{again:#}");
    let (code, _, stderr) = d.km0(&["dlq", "replay", "--id", &id_a]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("already replayed"), "{stderr}");
    let mut expected = before.clone();
    expected.audit_rows += 1;
    assert_eq!(
        d.snapshot().await,
        expected,
        "replaying again published or marked"
    );

    // The loop guard: a message that keeps failing is refused at the limit.
    d.json(&[
        "dlq",
        "replay",
        "--id",
        &id_t,
        "--max-replays",
        "1",
        "--json",
    ])
    .await;
    d.wait_dead_letters(5).await;
    d.wait_caught_up().await;
    let again = d
        .json(&["dlq", "list", "--motivo", "trufa", "--json"])
        .await;
    assert_eq!(again[0]["replays"], 1, "{again:#}");
    let history = d
        .json(&["dlq", "show", again[0]["id"].as_str().unwrap(), "--json"])
        .await;
    assert_eq!(
        history["history"].as_array().unwrap().len(),
        2,
        "{history:#}"
    );
    let before = d.snapshot().await;
    let guard = d
        .json(&[
            "dlq",
            "replay",
            "--motivo",
            "trufa",
            "--max-replays",
            "1",
            "--json",
        ])
        .await;
    assert_eq!(guard["applied"].as_array().unwrap().len(), 0, "{guard:#}");
    assert!(
        guard["refused"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("limit 1"),
        "{guard:#}"
    );
    assert_eq!(
        d.snapshot().await.origin_end,
        before.origin_end,
        "the guard let it through"
    );

    // To one group only, without the replay key: refused, nothing published.
    let (code, _, stderr) = d
        .km0_keyed(
            &["dlq", "replay", "--motivo", "trufa", "--group", "analitica"],
            "",
        )
        .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("replay key"), "{stderr}");
    assert_eq!(d.snapshot().await.origin_end, before.origin_end);

    // To one group only: another group's replay, signed, is acknowledged by inventario,
    // unhandled.
    d.json(&[
        "dlq",
        "replay",
        "--motivo",
        "trufa",
        "--group",
        "analitica",
        "--json",
    ])
    .await;
    d.wait_caught_up().await;
    let after = d.snapshot().await;
    assert_eq!(after.origin_end, before.origin_end + 1);
    assert_eq!(
        after.dead_letters, 5,
        "inventario handled another group's replay"
    );

    // Every action is audited: who, what, on what, how many, dry or not.
    let audit = d.audit_rows().await;
    let summary: Vec<(String, bool, i64, i64, i64)> = audit
        .iter()
        .map(|r| (r.action.clone(), r.dry_run, r.matched, r.applied, r.refused))
        .collect();
    let row = |action: &str, dry, m, a, r| (action.to_owned(), dry, m, a, r);
    assert_eq!(
        summary,
        [
            row("replay", true, 2, 2, 0),
            row("discard", false, 1, 1, 0),
            row("replay", false, 2, 2, 0),
            row("replay", false, 0, 0, 0),
            row("replay", false, 1, 1, 0),
            row("replay", false, 1, 0, 1),
            row("replay", false, 1, 1, 0),
        ]
    );
    // The operator is the user the system says runs the command; there is no flag to
    // claim another name.
    let os_user = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let os_user = String::from_utf8(os_user.stdout).unwrap();
    assert!(
        audit.iter().all(|r| r.operator == os_user.trim()),
        "{audit:?}"
    );
    let (code, _, stderr) = d
        .km0(&["dlq", "replay", "--motivo", "x", "--operator", "mallory"])
        .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(audit[1].detail.as_deref() == Some("tipo retirado"));
    assert!(audit.iter().all(|r| !r.operator.is_empty() && r.at_ms > 0));
    let final_stats = d.json(&["dlq", "stats", "--json"]).await;
    let topic = &final_stats["topics"][0];
    assert_eq!(
        (
            topic["pending"].as_u64(),
            topic["replayed"].as_u64(),
            topic["discarded"].as_u64()
        ),
        (Some(0), Some(4), Some(1))
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_on_the_sqlite_log() {
    let dir = std::env::temp_dir().join(format!("km0-dlqb-{}", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite://{}", dir.join("broker.db").display());
    tend_the_dead_letters(&url, Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_on_kafka() {
    let kafka = KafkaNamespace::new();
    let url = kafka.url_with("session_timeout_ms=6000");
    tend_the_dead_letters(&url, Duration::from_secs(90)).await;
}

/// A dead letter whose key another producer filled with terminal controls: `km0 dlq list`
/// shows the controls escaped instead of sending them to the operator's terminal, and its
/// JSON still carries the key as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_list_shows_control_characters_without_obeying_them() {
    let dir = std::env::temp_dir().join(format!("km0-dlqe-{}", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite://{}", dir.join("broker.db").display());
    let d = Deployment::start(&url, Duration::from_secs(30)).await;
    let key = "PE\u{1b}[2J\u{1b}]0;owned\u{7}";
    d.order(key, "pedido.extraviado", "tomate-rosa", 1).await;
    d.wait_dead_letters(1).await;
    let (code, text, stderr) = d.km0(&["dlq", "list"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "raw controls reached the terminal: {text:?}"
    );
    assert!(
        text.contains("PE\\u001b[2J\\u001b]0;owned\\u0007"),
        "{text}"
    );
    let listed = d.json(&["dlq", "list", "--json"]).await;
    assert_eq!(listed[0]["key"], key);
    d.finish().await;
    let _ = std::fs::remove_dir_all(&dir);
}
