//! The dead-letter tooling reading: what `list` and `stats` show and how filters combine,
//! and the requests it refuses without changing anything (in-memory log and state store).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::dlq_support;

use entrega::dlq::{DiscardOptions, DlqError, DlqFilter, ReplayOptions};
use entrega_core::{DeadLetterId, DlqStore, Publisher, TopicAdmin};

use dlq_support::{dead, fixture, id, origin_records, put, DLQ, START_MS, TOPIC};

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
    assert_eq!(first.kind.as_deref(), Some("pedido.creado"));
    assert_eq!(first.reason, "producto desconocido: queso-azul");
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
    let by_tipo = DlqFilter::all().with_kind("pedido.creado");
    assert_eq!(
        keys(fx.tool.list(&by_tipo, false).await.unwrap()),
        ["P-1", "P-3"]
    );
    let by_reason = DlqFilter::all().with_reason("QUESO");
    assert_eq!(
        keys(fx.tool.list(&by_reason, false).await.unwrap()),
        ["P-1", "P-3"]
    );
    let both = by_reason.clone().with_kind("pedido.creado");
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
            DlqFilter::id(id(0)).with_kind("pedido.creado"),
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
        (DlqFilter::all().with_reason(" "), "--motivo is empty"),
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
