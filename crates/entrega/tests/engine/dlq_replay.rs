//! The dead-letter tooling acting: replay (order per key, headers, marks, the loop guard, one
//! group), discard, dry runs, and the audit of each (in-memory log and state store).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::dlq_support;

use std::sync::Arc;

use entrega::dlq::{DeadLetters, DiscardOptions, DlqError, DlqFilter, ReplayOptions};
use entrega_core::headers::{
    CLASS, CODE, ID_EVENTO, INTENTOS, MOTIVO, ONLY_GROUP, ONLY_GROUP_SIGNATURE, ORIGIN_OFFSET,
    ORIGIN_TOPIC, REPLAYS, TIPO,
};
use entrega_core::{DeadLetterState, DlqStore, OutgoingMessage, Publisher, TransportError};

use dlq_support::{dead, fixture, id, origin_records, put, DLQ};

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
        assert_eq!(record.headers.get(REPLAYS), Some("1"));
        assert_eq!(record.headers.get(ID_EVENTO), letter.event_id.as_deref());
        assert_eq!(record.headers.get("traceparent"), Some("00-abc-def-01"));
        for gone in [
            INTENTOS,
            MOTIVO,
            CLASS,
            CODE,
            ORIGIN_TOPIC,
            ORIGIN_OFFSET,
            ONLY_GROUP,
            ONLY_GROUP_SIGNATURE,
        ] {
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
        .map(|r| r.headers.get(REPLAYS).unwrap())
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
    assert_eq!(published[0].headers.get(ONLY_GROUP), Some("inventario"));
    // Signed for that group, that key and that payload: the consumers' key verifies it.
    assert_eq!(
        dlq_support::replay_key().solo_group(
            &published[0].headers,
            published[0].key.as_deref(),
            &published[0].payload
        ),
        Some(Ok("inventario"))
    );
    // Without the key, a replay to one group is refused before anything is published.
    let unsigned = DeadLetters::new(
        Arc::new(fx.log.clone()),
        Arc::new(fx.log.clone()),
        Arc::new(fx.store.clone()),
        vec![DLQ.to_owned()],
    );
    let refused = unsigned.replay(&DlqFilter::all(), &options).await;
    assert!(matches!(refused, Err(DlqError::NoReplayKey)), "{refused:?}");
    assert_eq!(origin_records(&fx).len(), 1);

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
async fn a_letter_an_earlier_release_wrote_is_read_and_replayed_under_the_english_names() {
    use entrega_core::headers::former;
    let fx = fixture().await;
    // A dead letter written before entrega's headers were English, replayed once already.
    let mut earlier = dead("K", "pedido.creado", "producto desconocido: a", 0);
    for (now, then) in [(CLASS, former::CLASE), (CODE, former::CODIGO)] {
        let value = earlier.headers.get(now).unwrap().to_owned();
        earlier.headers.remove(now);
        earlier.headers.set(then, value);
    }
    earlier.headers.set(former::REENVIOS, "1");
    put(&fx, vec![earlier]).await;

    let letters = fx.tool.list(&DlqFilter::all(), false).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].replays, 1, "entrega-reenvios read");
    assert_eq!(
        letters[0].code.as_deref(),
        Some("sin_stock"),
        "entrega-codigo read"
    );
    assert!(letters[0].failure.is_some(), "entrega-clase read");

    fx.tool
        .replay(&DlqFilter::all(), &ReplayOptions::new("ana"))
        .await
        .unwrap();
    let published = origin_records(&fx);
    assert_eq!(published.len(), 1);
    let headers = &published[0].headers;
    assert_eq!(
        headers.get(REPLAYS),
        Some("2"),
        "counted on under the new name"
    );
    for gone in [former::REENVIOS, former::CLASE, former::CODIGO] {
        assert_eq!(headers.get(gone), None, "{gone} left on the replay");
    }
}

#[tokio::test]
async fn an_action_confirming_a_count_the_selection_no_longer_has_does_nothing() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead("K", "pedido.creado", "producto desconocido: a", 0),
            dead("L", "pedido.creado", "producto desconocido: b", 0),
        ],
    )
    .await;
    let filter = DlqFilter::all().with_reason("desconocido");
    let mut dry = ReplayOptions::new("ana");
    dry.dry_run = true;
    let shown = fx.tool.replay(&filter, &dry).await.unwrap();
    assert_eq!(shown.matched, 2);
    // A third arrives between the dry run and the confirmation.
    put(
        &fx,
        vec![dead("M", "pedido.creado", "producto desconocido: c", 0)],
    )
    .await;
    let audited = fx.store.audit(10).await.unwrap().len();
    let mut replay = ReplayOptions::new("ana");
    replay.expect_matched = Some(shown.matched);
    let refused = fx.tool.replay(&filter, &replay).await.unwrap_err();
    assert!(
        matches!(
            refused,
            DlqError::SelectionChanged {
                expected: 2,
                matched: 3
            }
        ),
        "{refused:?}"
    );
    assert!(refused.is_usage());
    let mut discard = DiscardOptions::new("ana", "withdrawn");
    discard.expect_matched = Some(2);
    assert!(matches!(
        fx.tool.discard(&filter, &discard).await.unwrap_err(),
        DlqError::SelectionChanged { .. }
    ));
    assert!(origin_records(&fx).is_empty(), "nothing replayed");
    assert!(
        fx.store.marks(DLQ).await.unwrap().is_empty(),
        "nothing marked"
    );
    assert_eq!(
        fx.store.audit(10).await.unwrap().len(),
        audited,
        "nothing audited"
    );

    // Confirmed with what matches now, it goes through.
    replay.expect_matched = Some(3);
    let done = fx.tool.replay(&filter, &replay).await.unwrap();
    assert_eq!((done.matched, done.applied.len()), (3, 3));
    assert_eq!(origin_records(&fx).len(), 3);
}

/// A publisher whose broker takes 50 ms to confirm.
struct SlowPublisher(entrega_testkit::memory::MemoryLog);

#[async_trait::async_trait]
impl Publisher for SlowPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        self.0.publish(batch).await
    }
}

#[tokio::test]
async fn two_confirmations_of_one_selection_act_once() {
    let fx = fixture().await;
    put(
        &fx,
        (0..5)
            .map(|i| dead(&format!("K{i}"), "pedido.creado", "producto desconocido", 0))
            .collect(),
    )
    .await;
    let filter = DlqFilter::all().with_reason("desconocido");
    let mut dry = ReplayOptions::new("ana");
    dry.dry_run = true;
    let shown = fx.tool.replay(&filter, &dry).await.unwrap();
    assert_eq!(shown.matched, 5);

    // Two operators (or one double click) confirm the same dry run at the same moment; the
    // broker takes a while to confirm a publish, so both would read the selection pending.
    let tool = DeadLetters::new(
        Arc::new(fx.log.clone()),
        Arc::new(SlowPublisher(fx.log.clone())),
        Arc::new(fx.store.clone()),
        vec![DLQ.to_owned()],
    )
    .with_clock(fx.clock.clone());
    let mut confirm = ReplayOptions::new("ana");
    confirm.expect_matched = Some(shown.matched);
    confirm.expect_selection = Some(shown.selection.clone());
    let (a, b) = tokio::join!(
        tool.replay(&filter, &confirm),
        tool.replay(&filter, &confirm)
    );
    let (done, refused) = match (a, b) {
        (Ok(done), Err(refused)) | (Err(refused), Ok(done)) => (done, refused),
        other => panic!("one confirmation acts and the other is refused: {other:?}"),
    };
    assert_eq!(done.applied.len(), 5);
    assert!(
        matches!(
            refused,
            DlqError::SelectionChanged {
                expected: 5,
                matched: 0
            }
        ),
        "{refused:?}"
    );
    assert_eq!(origin_records(&fx).len(), 5, "each letter published once");
    assert_eq!(fx.store.marks(DLQ).await.unwrap().len(), 5);
}

#[tokio::test]
async fn a_selection_as_large_as_confirmed_but_of_other_letters_is_refused() {
    let fx = fixture().await;
    put(
        &fx,
        vec![
            dead("K", "pedido.creado", "producto desconocido: a", 0),
            dead("L", "pedido.creado", "producto desconocido: b", 0),
        ],
    )
    .await;
    let filter = DlqFilter::all().with_reason("desconocido");
    let mut dry = DiscardOptions::new("ana", "withdrawn");
    dry.dry_run = true;
    let shown = fx.tool.discard(&filter, &dry).await.unwrap();
    assert_eq!(shown.matched, 2);
    // Meanwhile one is replayed by its id and another arrives: two match, not the same two.
    let mut by_id = ReplayOptions::new("marc");
    by_id.max_replays = 3;
    fx.tool.replay(&DlqFilter::id(id(0)), &by_id).await.unwrap();
    put(
        &fx,
        vec![dead("M", "pedido.creado", "producto desconocido: c", 0)],
    )
    .await;
    let mut confirm = DiscardOptions::new("ana", "withdrawn");
    confirm.expect_matched = Some(2);
    confirm.expect_selection = Some(shown.selection.clone());
    let refused = fx.tool.discard(&filter, &confirm).await.unwrap_err();
    assert!(
        matches!(refused, DlqError::SelectionReplaced { matched: 2 }),
        "{refused:?}"
    );
    let discarded = fx
        .store
        .marks(DLQ)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.state == DeadLetterState::Discarded)
        .count();
    assert_eq!(discarded, 0, "nothing discarded");

    // The selection's token names the letters, not their count.
    let mut again = dry.clone();
    again.dry_run = true;
    let now = fx.tool.discard(&filter, &again).await.unwrap();
    assert_eq!(now.matched, 2);
    assert_ne!(now.selection, shown.selection);
    confirm.expect_selection = Some(now.selection);
    assert_eq!(
        fx.tool
            .discard(&filter, &confirm)
            .await
            .unwrap()
            .applied
            .len(),
        2
    );
}
