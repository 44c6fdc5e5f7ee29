//! Dead-letter operator state conformance: marks and audit entries recorded together, read
//! back as written, a later mark replacing an earlier one, the audit newest first.

use entrega_core::{
    DeadLetterId, DeadLetterMark, DeadLetterState, DlqAction, DlqAuditEntry, DlqStore,
};

use crate::ensure;
use crate::harness::{DlqFixture, DlqHarness, Scenario};

const TOPIC: &str = "pedidos.eventos.dlq";

async fn run<F>(h: &dyn DlqHarness, body: F) -> Scenario
where
    F: for<'a> FnOnce(
        &'a dyn DlqStore,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Scenario> + Send + 'a>>,
{
    let fx: Box<dyn DlqFixture> = h.dlq().await?;
    let store = fx.store();
    let result = body(store.as_ref()).await;
    drop(store);
    let teardown = fx.teardown().await;
    result.and(teardown)
}

fn entry(action: DlqAction, at_ms: i64, dry_run: bool) -> DlqAuditEntry {
    DlqAuditEntry {
        at_ms,
        operator: "ana".into(),
        action,
        filter: "--motivo producto".into(),
        dry_run,
        matched: 3,
        applied: 2,
        refused: 1,
        detail: Some("max replays 3".into()),
    }
}

fn mark(partition: u32, offset: i64, state: DeadLetterState, at_ms: i64) -> DeadLetterMark {
    DeadLetterMark {
        id: DeadLetterId::new(TOPIC, partition, offset),
        state,
        at_ms,
        operator: "ana".into(),
        reason: (state == DeadLetterState::Discarded).then(|| "duplicado del pedido 7".into()),
        replays: u32::from(state == DeadLetterState::Replayed),
    }
}

/// A fresh store has no marks and no audit entries.
pub async fn fresh_store_is_empty(h: &dyn DlqHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            ensure!(
                store.marks(TOPIC).await?.is_empty(),
                "marks in a fresh store"
            );
            ensure!(store.audit(10).await?.is_empty(), "audit in a fresh store");
            Ok(())
        })
    })
    .await
}

/// An action's entry and marks are read back as written, marks in partition and offset
/// order and only for their own topic.
pub async fn record_keeps_marks_and_entry(h: &dyn DlqHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            let marks = vec![
                mark(1, 4, DeadLetterState::Replayed, 1_000),
                mark(0, 9, DeadLetterState::Replayed, 1_000),
                mark(0, 2, DeadLetterState::Discarded, 1_000),
            ];
            let action = entry(DlqAction::Replay, 1_000, false);
            store.record(&action, &marks).await?;
            let mut other = mark(0, 2, DeadLetterState::Replayed, 1_000);
            other.id.topic = "otro.dlq".into();
            store
                .record(&entry(DlqAction::Replay, 1_001, false), &[other])
                .await?;
            let read = store.marks(TOPIC).await?;
            let expected = vec![marks[2].clone(), marks[1].clone(), marks[0].clone()];
            ensure!(read == expected, "marks read back as {read:?}");
            let newest = store.audit(1).await?;
            ensure!(
                newest == vec![entry(DlqAction::Replay, 1_001, false)],
                "audit limited to the newest: {newest:?}"
            );
            let all = store.audit(10).await?;
            ensure!(
                all.last() == Some(&action),
                "first entry read back as {:?}",
                all.last()
            );
            Ok(())
        })
    })
    .await
}

/// A later mark of the same dead letter replaces the earlier one.
pub async fn later_mark_replaces_earlier(h: &dyn DlqHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            let replayed = mark(0, 5, DeadLetterState::Replayed, 1_000);
            store
                .record(&entry(DlqAction::Replay, 1_000, false), &[replayed])
                .await?;
            let discarded = mark(0, 5, DeadLetterState::Discarded, 2_000);
            store
                .record(
                    &entry(DlqAction::Discard, 2_000, false),
                    std::slice::from_ref(&discarded),
                )
                .await?;
            let read = store.marks(TOPIC).await?;
            ensure!(read == vec![discarded], "marks after two actions: {read:?}");
            Ok(())
        })
    })
    .await
}

/// The audit comes newest first, dry runs and actions without marks included.
pub async fn audit_is_newest_first(h: &dyn DlqHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            let first = entry(DlqAction::Replay, 1_000, true);
            let mut second = entry(DlqAction::Discard, 2_000, false);
            second.detail = None;
            second.operator = "luis".into();
            let third = entry(DlqAction::Replay, 3_000, false);
            for e in [&first, &second, &third] {
                store.record(e, &[]).await?;
            }
            let read = store.audit(10).await?;
            ensure!(
                read == vec![third.clone(), second.clone(), first.clone()],
                "audit read back as {read:?}"
            );
            ensure!(
                store.audit(2).await? == vec![third, second],
                "audit limited to the newest two"
            );
            ensure!(store.marks(TOPIC).await?.is_empty(), "marks from no marks");
            Ok(())
        })
    })
    .await
}

/// The action lock has one holder at a time: another is refused while the lease runs, the
/// holder may take it again (its lease renewed), a lease that ended is passed over, and only
/// the holder gives it back.
pub async fn action_lock_has_one_holder(h: &dyn DlqHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            ensure!(
                store.lock_actions("ana", 1_000, 61_000).await?,
                "a free lock is refused"
            );
            ensure!(
                !store.lock_actions("marc", 2_000, 62_000).await?,
                "a held lock is taken by another"
            );
            ensure!(
                store.lock_actions("ana", 3_000, 63_000).await?,
                "its holder cannot take it again"
            );
            ensure!(
                !store.lock_actions("marc", 62_000, 122_000).await?,
                "the holder's renewed lease ended at its first end"
            );
            store.unlock_actions("marc").await?;
            ensure!(
                !store.lock_actions("marc", 4_000, 64_000).await?,
                "another gave the holder's lock back"
            );
            ensure!(
                store.lock_actions("marc", 63_001, 123_001).await?,
                "an ended lease is not passed over"
            );
            ensure!(
                !store.lock_actions("ana", 63_002, 123_002).await?,
                "the former holder takes it back from the new one"
            );
            store.unlock_actions("marc").await?;
            ensure!(
                store.lock_actions("ana", 63_003, 123_003).await?,
                "a lock given back stays held"
            );
            Ok(())
        })
    })
    .await
}
