//! The dead-letter tooling on the in-memory log and state store: what `list`, `stats`,
//! `replay` and `discard` read, publish, mark and audit, and what they refuse.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;

use entrega::dlq::{DeadLetters, DiscardOptions, DlqError, DlqFilter, ReplayOptions};
use entrega_core::headers::{
    ID_EVENTO, INTENTOS, MOTIVO, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC,
    REENVIOS, SOLO_GRUPO, TIPO,
};
use entrega_core::{
    DeadLetterId, DeadLetterState, DlqStore, Headers, ManualClock, OutgoingMessage, Publisher,
    Record, TopicAdmin,
};
use entrega_testkit::memory::{MemoryDlqStore, MemoryLog};
use entrega_testkit::LogSettings;

const TOPIC: &str = "pedidos.eventos";
const DLQ: &str = "pedidos.eventos.dlq";
const START_MS: i64 = 1_700_000_000_000;

struct Fixture {
    log: MemoryLog,
    store: MemoryDlqStore,
    clock: Arc<ManualClock>,
    tool: DeadLetters,
}

async fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(START_MS));
    let log = MemoryLog::with_settings(LogSettings::default(), clock.clone());
    log.ensure_topic(TOPIC, 2).await.unwrap();
    log.ensure_topic(DLQ, 1).await.unwrap();
    let store = MemoryDlqStore::new();
    let tool = DeadLetters::new(
        Arc::new(log.clone()),
        Arc::new(log.clone()),
        Arc::new(store.clone()),
        vec![DLQ.to_owned()],
    )
    .with_clock(clock.clone());
    Fixture {
        log,
        store,
        clock,
        tool,
    }
}

/// A dead letter as the worker writes it, `replays` times replayed before.
fn dead(key: &str, tipo: &str, motivo: &str, replays: u32) -> OutgoingMessage {
    let id = uuid::Uuid::new_v4().to_string();
    let mut headers = Headers::new()
        .with(TIPO, tipo)
        .with(ID_EVENTO, id.clone())
        .with("traceparent", "00-abc-def-01")
        .with(INTENTOS, "3")
        .with(MOTIVO, motivo)
        .with(ORIGIN_TOPIC, TOPIC)
        .with(ORIGIN_PARTITION, "1")
        .with(ORIGIN_OFFSET, "42")
        .with(ORIGIN_GROUP, "inventario");
    if replays > 0 {
        headers.set(REENVIOS, replays.to_string());
    }
    let payload = serde_json::json!({"id_evento": id, "tipo": tipo, "version": 1,
        "fecha_ms": START_MS, "origen": "pedidos", "datos": {"id": key}});
    OutgoingMessage {
        topic: DLQ.to_owned(),
        key: Some(key.to_owned()),
        headers,
        payload: serde_json::to_vec(&payload).unwrap(),
    }
}

async fn put(fx: &Fixture, letters: Vec<OutgoingMessage>) {
    for letter in letters {
        fx.log.publish(&[letter]).await.unwrap();
        fx.clock.advance(1_000);
    }
}

fn origin_records(fx: &Fixture) -> Vec<Record> {
    fx.log.records(TOPIC)
}

fn id(offset: i64) -> DeadLetterId {
    DeadLetterId::new(DLQ, 0, offset)
}

#[tokio::test]
async fn list_reads_every_field_and_filters_combine() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead(
                "P-1",
                "pedido.creado",
                "producto desconocido: queso-azul",
                0,
            ),
            dead("P-2", "pedido.raro", "unknown tipo `pedido.raro`", 0),
            dead("P-3", "pedido.creado", "sin stock de queso-curado", 1),
        ],
    )
    .await;
    let all = fx.tool.list(&DlqFilter::all(), false).await.unwrap();
    assert_eq!(all.len(), 3);
    let first = &all[0];
    assert_eq!(first.id.to_string(), "pedidos.eventos.dlq/0/0");
    assert_eq!(first.key.as_deref(), Some("P-1"));
    assert_eq!(first.tipo.as_deref(), Some("pedido.creado"));
    assert_eq!(first.motivo, "producto desconocido: queso-azul");
    assert_eq!(first.class(), "producto desconocido");
    assert_eq!(first.attempts, Some(3));
    assert_eq!(first.replays, 0);
    assert_eq!(first.origin.topic, TOPIC);
    assert_eq!(first.origin.partition, Some(1));
    assert_eq!(first.origin.offset, Some(42));
    assert_eq!(first.origin.group.as_deref(), Some("inventario"));
    assert_eq!(first.timestamp_ms, START_MS);
    assert_eq!(first.state(), "pending");
    assert_eq!(all[2].replays, 1);

    let keys = |letters: Vec<entrega::dlq::DeadLetter>| -> Vec<String> {
        letters.into_iter().filter_map(|l| l.key).collect()
    };
    let by_tipo = DlqFilter::all().with_tipo("pedido.creado");
    assert_eq!(
        keys(fx.tool.list(&by_tipo, false).await.unwrap()),
        ["P-1", "P-3"]
    );
    let by_motivo = DlqFilter::all().with_motivo("QUESO");
    assert_eq!(
        keys(fx.tool.list(&by_motivo, false).await.unwrap()),
        ["P-1", "P-3"]
    );
    let both = by_motivo.clone().with_tipo("pedido.creado");
    let later = both.with_time(Some(START_MS + 1), None);
    assert_eq!(keys(fx.tool.list(&later, false).await.unwrap()), ["P-3"]);
    let earlier = DlqFilter::all().with_time(None, Some(START_MS + 1_000));
    assert_eq!(
        keys(fx.tool.list(&earlier, false).await.unwrap()),
        ["P-1", "P-2"]
    );
    let one = DlqFilter::id(id(1));
    assert_eq!(keys(fx.tool.list(&one, false).await.unwrap()), ["P-2"]);
}

#[tokio::test]
async fn bad_requests_are_usage_errors_and_change_nothing() {
    let fx = fixture().await;
    put(
        &fx,
        vec![dead("P-1", "pedido.creado", "producto desconocido: x", 0)],
    )
    .await;
    let replay = ReplayOptions::new("ana");
    let cases: Vec<(DlqFilter, &str)> = vec![
        (
            DlqFilter::id(id(0)).with_tipo("pedido.creado"),
            "cannot be combined with --tipo",
        ),
        (
            DlqFilter::all().with_time(Some(START_MS + 10), Some(START_MS)),
            "is after --until",
        ),
        (
            DlqFilter::id(id(7)),
            "no dead letter pedidos.eventos.dlq/0/7",
        ),
        (
            DlqFilter::id(DeadLetterId::new(DLQ, 3, 0)),
            "no dead letter",
        ),
        (
            DlqFilter::id(DeadLetterId::new("otro.dlq", 0, 0)),
            "not on a dead-letter topic",
        ),
        (
            DlqFilter::all().with_topic("otro.dlq"),
            "not a tended dead-letter topic",
        ),
        (DlqFilter::all().with_motivo(" "), "--motivo is empty"),
    ];
    for (filter, expected) in cases {
        let err = fx.tool.replay(&filter, &replay).await.unwrap_err();
        assert!(err.is_usage(), "{err}");
        assert!(
            err.to_string().contains(expected),
            "`{err}` lacks `{expected}`"
        );
        let err = fx.tool.list(&filter, true).await.unwrap_err();
        assert!(err.is_usage(), "{err}");
    }
    let no_reason = DiscardOptions::new("ana", "  ");
    let err = fx
        .tool
        .discard(&DlqFilter::all(), &no_reason)
        .await
        .unwrap_err();
    assert!(matches!(err, DlqError::ReasonRequired), "{err}");
    let mut zero = ReplayOptions::new("ana");
    zero.max_replays = 0;
    assert!(fx
        .tool
        .replay(&DlqFilter::all(), &zero)
        .await
        .unwrap_err()
        .is_usage());

    assert!(origin_records(&fx).is_empty(), "something was published");
    assert!(fx.store.entries().is_empty(), "something was audited");
    assert!(
        fx.store.marks(DLQ).await.unwrap().is_empty(),
        "something was marked"
    );
}

#[tokio::test]
async fn replay_publishes_in_order_marks_and_audits_once() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead("K", "pedido.creado", "producto desconocido: a", 0),
            dead("L", "pedido.creado", "producto desconocido: b", 0),
            dead("K", "pedido.pagado", "producto desconocido: c", 0),
            dead("K", "pedido.cancelado", "producto desconocido: d", 0),
        ],
    )
    .await;
    let letters = fx.tool.list(&DlqFilter::all(), false).await.unwrap();
    let report = fx
        .tool
        .replay(&DlqFilter::all(), &ReplayOptions::new("ana"))
        .await
        .unwrap();
    assert_eq!(
        (report.matched, report.applied.len(), report.refused.len()),
        (4, 4, 0)
    );

    let published = origin_records(&fx);
    assert_eq!(published.len(), 4);
    let of_k: Vec<&str> = published
        .iter()
        .filter(|r| r.key.as_deref() == Some("K"))
        .map(|r| r.headers.get(TIPO).unwrap())
        .collect();
    assert_eq!(of_k, ["pedido.creado", "pedido.pagado", "pedido.cancelado"]);
    for record in &published {
        let letter = letters
            .iter()
            .find(|l| l.payload == record.payload)
            .unwrap();
        assert_eq!(record.key, letter.key, "key kept");
        assert_eq!(record.headers.get(REENVIOS), Some("1"));
        assert_eq!(record.headers.get(ID_EVENTO), letter.event_id.as_deref());
        assert_eq!(record.headers.get("traceparent"), Some("00-abc-def-01"));
        for gone in [INTENTOS, MOTIVO, ORIGIN_TOPIC, ORIGIN_OFFSET, SOLO_GRUPO] {
            assert_eq!(record.headers.get(gone), None, "{gone} left on the replay");
        }
    }
    let marks = fx.store.marks(DLQ).await.unwrap();
    assert_eq!(marks.len(), 4);
    assert!(marks
        .iter()
        .all(|m| m.state == DeadLetterState::Replayed && m.replays == 1 && m.operator == "ana"));
    assert!(fx
        .tool
        .list(&DlqFilter::all(), false)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        fx.tool.list(&DlqFilter::all(), true).await.unwrap().len(),
        4
    );

    // Again: nothing pending, nothing published; by id it is refused.
    let again = fx
        .tool
        .replay(&DlqFilter::all(), &ReplayOptions::new("ana"))
        .await
        .unwrap();
    assert_eq!((again.matched, again.applied.len()), (0, 0));
    let by_id = fx
        .tool
        .replay(&DlqFilter::id(id(0)), &ReplayOptions::new("ana"))
        .await;
    assert!(
        matches!(by_id, Err(DlqError::NotPending { .. })),
        "{by_id:?}"
    );
    assert_eq!(origin_records(&fx).len(), 4);
    let audit = fx.store.entries();
    assert_eq!(audit.len(), 2);
    assert_eq!(
        (audit[0].matched, audit[0].applied, audit[0].dry_run),
        (4, 4, false)
    );
    assert_eq!((audit[1].matched, audit[1].applied), (0, 0));
}

#[tokio::test]
async fn loop_guard_refuses_at_the_limit_and_holds_the_rest_of_its_key() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead("K", "pedido.creado", "sin stock de x", 2),
            dead("K", "pedido.pagado", "sin stock de x", 0),
            dead("L", "pedido.creado", "sin stock de x", 0),
        ],
    )
    .await;
    let mut options = ReplayOptions::new("ana");
    options.max_replays = 2;
    let report = fx.tool.replay(&DlqFilter::all(), &options).await.unwrap();
    let refused: Vec<(&str, &str)> = report
        .refused
        .iter()
        .map(|r| (r.id.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].1.contains("replayed 2 times already (limit 2)"),
        "{refused:?}"
    );
    assert!(refused[1].1.starts_with("held"), "{refused:?}");
    let published = origin_records(&fx);
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].key.as_deref(), Some("L"));
    let pending = fx.tool.list(&DlqFilter::all(), false).await.unwrap();
    assert_eq!(
        pending.iter().map(|l| l.id.offset).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(fx.store.entries()[0].refused, 2);

    // The default limit (3) lets the first one go once more.
    let report = fx
        .tool
        .replay(&DlqFilter::all(), &ReplayOptions::new("ana"))
        .await
        .unwrap();
    assert_eq!(report.applied.len(), 2);
    let all = origin_records(&fx);
    let replays: Vec<&str> = all[1..]
        .iter()
        .map(|r| r.headers.get(REENVIOS).unwrap())
        .collect();
    assert_eq!(replays, ["3", "1"]);
}

#[tokio::test]
async fn dry_runs_change_nothing_but_are_audited() {
    let fx = fixture().await;
    put(
        &fx,
        vec![dead("K", "pedido.creado", "producto desconocido: a", 0)],
    )
    .await;
    let mut replay = ReplayOptions::new("ana");
    replay.dry_run = true;
    let report = fx.tool.replay(&DlqFilter::all(), &replay).await.unwrap();
    assert_eq!((report.applied.len(), report.dry_run), (1, true));
    let mut discard = DiscardOptions::new("ana", "prueba");
    discard.dry_run = true;
    let report = fx.tool.discard(&DlqFilter::all(), &discard).await.unwrap();
    assert_eq!(report.applied.len(), 1);
    assert!(origin_records(&fx).is_empty());
    assert!(fx.store.marks(DLQ).await.unwrap().is_empty());
    let audit = fx.store.entries();
    assert_eq!(audit.len(), 2);
    assert!(audit.iter().all(|e| e.dry_run && e.applied == 1));
}

#[tokio::test]
async fn replay_to_one_group_and_discard_with_a_reason() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead("K", "pedido.creado", "producto desconocido: a", 0),
            dead("L", "pedido.raro", "unknown tipo `pedido.raro`", 0),
        ],
    )
    .await;
    let mut options = ReplayOptions::new("ana");
    options.group = Some("inventario".into());
    fx.tool
        .replay(&DlqFilter::id(id(0)), &options)
        .await
        .unwrap();
    let published = origin_records(&fx);
    assert_eq!(published[0].headers.get(SOLO_GRUPO), Some("inventario"));

    let discard = DiscardOptions::new("luis", "tipo retirado");
    let report = fx.tool.discard(&DlqFilter::all(), &discard).await.unwrap();
    assert_eq!(report.applied.len(), 1, "only the pending one");
    let marks = fx.store.marks(DLQ).await.unwrap();
    assert_eq!(marks[1].state, DeadLetterState::Discarded);
    assert_eq!(marks[1].reason.as_deref(), Some("tipo retirado"));
    assert_eq!(marks[1].operator, "luis");
    assert!(fx
        .tool
        .list(&DlqFilter::all(), false)
        .await
        .unwrap()
        .is_empty());
    let audit = fx.store.entries();
    assert_eq!(audit[1].detail.as_deref(), Some("tipo retirado"));
    assert!(audit[0]
        .detail
        .as_deref()
        .unwrap()
        .contains("only group inventario"));
}

#[tokio::test]
async fn stats_count_by_motivo_class_and_state_with_retry_depth() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead("A", "pedido.creado", "producto desconocido: a", 0),
            dead("B", "pedido.creado", "producto desconocido: b", 0),
            dead("C", "pedido.creado", "producto desconocido: b", 0),
            dead("D", "pedido.raro", "unknown tipo `pedido.raro`", 0),
        ],
    )
    .await;
    fx.tool
        .discard(
            &DlqFilter::id(id(3)),
            &DiscardOptions::new("ana", "retirado"),
        )
        .await
        .unwrap();
    fx.tool
        .replay(&DlqFilter::id(id(0)), &ReplayOptions::new("ana"))
        .await
        .unwrap();
    let retry = format!("{TOPIC}.retry");
    fx.log.ensure_topic(&retry, 1).await.unwrap();
    let mut retried = dead("A", "pedido.creado", "x", 0);
    retried.topic = retry.clone();
    fx.log.publish(&[retried.clone(), retried]).await.unwrap();

    let stats = fx.tool.stats(&DlqFilter::all(), None).await.unwrap();
    let json = serde_json::to_value(&stats).unwrap();
    let topic = &json["topics"][0];
    assert_eq!(topic["topic"], DLQ);
    assert_eq!(topic["origin_topic"], TOPIC);
    assert_eq!(
        (
            topic["pending"].as_u64(),
            topic["replayed"].as_u64(),
            topic["discarded"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(topic["total"], 4);
    assert_eq!(topic["by_motivo"][0]["motivo"], "producto desconocido: b");
    assert_eq!(topic["by_motivo"][0]["pending"], 2);
    assert_eq!(topic["by_class"][0]["motivo"], "producto desconocido");
    assert_eq!(topic["by_class"][0]["pending"], 2);
    assert_eq!(topic["by_class"][0]["replayed"], 1);
    assert_eq!(topic["by_class"][1]["motivo"], "unknown tipo");
    assert_eq!(topic["by_class"][1]["discarded"], 1);
    assert_eq!(topic["retry"]["topic"], retry);
    assert_eq!(topic["retry"]["depth"], 2);
    assert!(topic["retry"]["committed"].is_null());
    assert_eq!(json["totals"]["pending"], 2);
}
