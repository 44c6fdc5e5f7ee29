//! Outbox conformance, rows: visibility of committed and rolled-back enqueues, order within a
//! lane, late commits, purge, status and wake-up. Every function is one scenario, run on a
//! fresh outbox.

use std::time::Duration;

use entrega_core::{now_ms, Clock, NewEvent};
use tokio::time::Instant;

use super::outbox_support::{event, holder, lane_of_row, lease_for, run, TTL};
use crate::ensure;
use crate::harness::{OutboxHarness, Scenario, TxEnd};
use crate::wait::wait_until;

/// A rolled-back enqueue leaves no row, nothing pending and no status.
pub async fn rolled_back_enqueue_leaves_nothing(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let events = [event("rb-1", 1), event("rb-1", 2), event("rb-2", 3)];
            fx.enqueue(&events, TxEnd::Rollback).await?;
            ensure!(fx.row_count().await? == 0, "rolled-back rows are stored");
            for e in &events {
                ensure!(
                    fx.row(e.id).await?.is_none(),
                    "rolled-back row {} exists",
                    e.id
                );
            }
            let held = fx
                .leases()
                .balance(&holder("r"), clock.now_ms(), TTL)
                .await?;
            for lease in &held {
                let pending = fx.reader().pending(lease.lane, 100).await?;
                ensure!(
                    pending.is_empty(),
                    "lane {} has pending rows after a rollback",
                    lease.lane
                );
            }
            ensure!(
                fx.maintenance().status(clock.now_ms()).await?.pending == 0,
                "status counts rolled-back rows"
            );
            // The helper does write when asked to commit, so the checks above mean something.
            fx.enqueue(&events[..1], TxEnd::Commit).await?;
            ensure!(
                fx.row_count().await? == 1,
                "a committed enqueue is not stored"
            );
            Ok(())
        })
    })
    .await
}

/// Within a lane, pending rows come in insertion order, across and within transactions.
pub async fn pending_follows_insertion_order(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let mine: Vec<NewEvent> = (0..6).map(|n| event("order-7", n)).collect();
            fx.enqueue(&mine[..2], TxEnd::Commit).await?;
            fx.enqueue(&[event("other-1", 0), event("other-2", 0)], TxEnd::Commit)
                .await?;
            fx.enqueue(&mine[2..3], TxEnd::Commit).await?;
            fx.enqueue(&[event("other-3", 0)], TxEnd::Commit).await?;
            fx.enqueue(&mine[3..], TxEnd::Commit).await?;
            let lane = lane_of_row(fx, &mine[0]).await?;
            let _ = lease_for(fx, "r", lane, clock.now_ms()).await?;
            let pending = fx.reader().pending(lane, 100).await?;
            let got: Vec<_> = pending
                .iter()
                .filter(|r| r.aggregate_id == "order-7")
                .map(|r| r.id)
                .collect();
            let want: Vec<_> = mine.iter().map(|e| e.id).collect();
            ensure!(
                got == want,
                "lane order {got:?} differs from insertion order {want:?}"
            );
            let mut last_seq = i64::MIN;
            for row in &pending {
                let state = fx.row(row.id).await?.ok_or("pending row vanished")?;
                ensure!(
                    state.lane == lane,
                    "pending({lane}) returned a row of lane {}",
                    state.lane
                );
                ensure!(row.seq > last_seq, "seq not increasing in pending()");
                last_seq = row.seq;
            }
            let first_two = fx.reader().pending(lane, 2).await?;
            ensure!(
                first_two.len() == 2 && first_two[..] == pending[..2],
                "limit does not return the oldest rows"
            );
            Ok(())
        })
    })
    .await
}

/// A row whose transaction commits after later rows were published is still found pending.
pub async fn late_commit_is_still_pending(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let late = event("late-1", 0);
            let held_tx = fx.enqueue_held(std::slice::from_ref(&late)).await?;
            let later = [event("late-1", 1), event("late-1", 2)];
            fx.enqueue(&later, TxEnd::Commit).await?;
            let lane = lane_of_row(fx, &later[0]).await?;
            let lease = lease_for(fx, "r", lane, clock.now_ms()).await?;
            let pending = fx.reader().pending(lane, 10).await?;
            ensure!(
                pending.iter().all(|r| r.id != late.id),
                "an uncommitted row is visible"
            );
            let ids: Vec<_> = pending.iter().map(|r| r.id).collect();
            fx.reader()
                .mark_published(&lease, &ids, clock.now_ms())
                .await?;
            held_tx.commit().await?;
            let pending = fx.reader().pending(lane, 10).await?;
            ensure!(
                pending.len() == 1 && pending[0].id == late.id,
                "the late row is not pending after its commit: {pending:?}"
            );
            fx.reader()
                .mark_published(&lease, &[late.id], clock.now_ms())
                .await?;
            ensure!(
                fx.reader().pending(lane, 10).await?.is_empty(),
                "lane not drained"
            );
            Ok(())
        })
    })
    .await
}

/// Purge deletes rows published before the cutoff and never a pending row.
pub async fn purge_removes_published_by_age(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (old, recent, pending) = (
                event("purge-1", 1),
                event("purge-1", 2),
                event("purge-1", 3),
            );
            fx.enqueue(
                &[old.clone(), recent.clone(), pending.clone()],
                TxEnd::Commit,
            )
            .await?;
            let t1 = clock.now_ms();
            let lease = lease_for(fx, "r", lane_of_row(fx, &old).await?, t1).await?;
            fx.reader().mark_published(&lease, &[old.id], t1).await?;
            fx.reader()
                .mark_published(&lease, &[recent.id], t1 + 10_000)
                .await?;
            ensure!(
                fx.maintenance().purge_published(t1 + 5_000).await? == 1,
                "purge count for the old row"
            );
            ensure!(
                fx.row(old.id).await?.is_none(),
                "the old published row survived the purge"
            );
            ensure!(
                fx.row(recent.id).await?.is_some(),
                "a recent published row was purged"
            );
            ensure!(
                fx.maintenance().purge_published(t1 + 60_000).await? == 1,
                "purge count for the recent row"
            );
            ensure!(
                fx.row(pending.id).await?.is_some(),
                "a pending row was purged"
            );
            ensure!(fx.row_count().await? == 1, "purge left the wrong rows");
            Ok(())
        })
    })
    .await
}

/// Status counts pending and published rows and ages the oldest pending one.
pub async fn status_reports_backlog(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let empty = fx.maintenance().status(clock.now_ms()).await?;
            ensure!(
                empty.pending == 0 && empty.published == 0 && empty.oldest_pending_age_ms == 0,
                "empty status {empty:?}"
            );
            let events = [event("st-1", 1), event("st-1", 2), event("st-2", 1)];
            fx.enqueue(&events, TxEnd::Commit).await?;
            // `creado_en` may come from the database's own clock, so age against wall time.
            let later = now_ms().max(clock.now_ms()) + 60_000;
            let status = fx.maintenance().status(later).await?;
            ensure!(
                status.pending == 3 && status.published == 0,
                "status after enqueue {status:?}"
            );
            ensure!(
                (59_000..=180_000).contains(&status.oldest_pending_age_ms),
                "oldest pending age {} ms, expected about 60000",
                status.oldest_pending_age_ms
            );
            let lease =
                lease_for(fx, "r", lane_of_row(fx, &events[0]).await?, clock.now_ms()).await?;
            fx.reader()
                .mark_published(&lease, &[events[0].id], clock.now_ms())
                .await?;
            let status = fx.maintenance().status(later).await?;
            ensure!(
                status.pending == 2 && status.published == 1,
                "status after one mark {status:?}"
            );
            Ok(())
        })
    })
    .await
}

/// A waiting relay wakes up promptly after a commit, long before its timeout.
pub async fn wakeup_returns_after_commit(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, _clock| {
        Box::pin(async move {
            let wakeup = fx.wakeup();
            let timeout = Duration::from_secs(30);
            let waiter = tokio::spawn(async move {
                let start = Instant::now();
                wakeup.wait(timeout).await;
                start.elapsed()
            });
            // Commit repeatedly: a listener may start listening only after the first commit.
            let mut n = 0;
            let woke = wait_until(Duration::from_secs(10), || {
                n += 1;
                let finished = waiter.is_finished();
                let events = [event("wake-1", n)];
                async move {
                    if !finished {
                        let _ = fx.enqueue(&events, TxEnd::Commit).await;
                        tokio::time::sleep(Duration::from_millis(90)).await;
                    }
                    finished
                }
            })
            .await;
            ensure!(woke, "wait() did not return within 10 s of commits");
            let elapsed = waiter.await?;
            ensure!(elapsed < timeout, "wait() returned only at its timeout");
            Ok(())
        })
    })
    .await
}
