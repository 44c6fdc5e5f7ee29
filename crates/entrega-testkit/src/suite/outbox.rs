//! Outbox conformance: visibility, order within a lane, fenced lane leases, late commits,
//! purge, status and wake-up. Every function is one scenario, run on a fresh outbox.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use entrega_core::{now_ms, Clock, LaneLease, ManualClock, NewEvent, StoreError, LANES};
use serde_json::json;
use tokio::time::Instant;

use crate::ensure;
use crate::harness::{BoxError, OutboxFixture, OutboxHarness, Scenario, TxEnd};
use crate::wait::wait_until;

const TTL: Duration = Duration::from_secs(10);
const TTL_MS: i64 = 10_000;

/// A version-1 `pedido` event for `aggregate_id` carrying `n`.
pub fn event(aggregate_id: &str, n: u32) -> NewEvent {
    NewEvent::new("pedido", aggregate_id, "pedido.creado", json!({ "n": n }))
}

async fn run<F>(h: &dyn OutboxHarness, body: F) -> Scenario
where
    F: for<'a> FnOnce(
        &'a dyn OutboxFixture,
        ManualClock,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Scenario> + Send + 'a>>,
{
    let clock = ManualClock::new(now_ms());
    let fx = h.outbox(Arc::new(clock.clone())).await?;
    let result = body(fx.as_ref(), clock).await;
    let teardown = fx.teardown().await;
    result.and(teardown)
}

async fn lease_for(
    fx: &dyn OutboxFixture,
    owner: &str,
    lane: u32,
    now: i64,
) -> Result<LaneLease, BoxError> {
    let held = fx.leases().balance(owner, now, TTL).await?;
    held.into_iter()
        .find(|l| l.lane == lane)
        .ok_or_else(|| format!("{owner} does not hold lane {lane} after balancing alone").into())
}

async fn lane_of_row(fx: &dyn OutboxFixture, e: &NewEvent) -> Result<u32, BoxError> {
    Ok(fx.row(e.id).await?.ok_or("committed row not found")?.lane)
}

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
            let held = fx.leases().balance("r", clock.now_ms(), TTL).await?;
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

/// Marking needs the current lease: a stale token, another owner or a released lane is
/// refused with `LeaseLost` and changes nothing.
pub async fn mark_requires_valid_lease(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let first = event("lease-1", 1);
            fx.enqueue(std::slice::from_ref(&first), TxEnd::Commit)
                .await?;
            let lane = lane_of_row(fx, &first).await?;
            let lease = lease_for(fx, "r1", lane, clock.now_ms()).await?;
            let stale = LaneLease {
                token: lease.token - 1,
                ..lease.clone()
            };
            let intruder = LaneLease {
                owner: "intruder".into(),
                ..lease.clone()
            };
            for bad in [&stale, &intruder] {
                let res = fx
                    .reader()
                    .mark_published(bad, &[first.id], clock.now_ms())
                    .await;
                ensure!(
                    matches!(res, Err(StoreError::LeaseLost { .. })),
                    "mark with {bad:?} gave {res:?}"
                );
                ensure!(
                    !fx.row(first.id).await?.ok_or("row vanished")?.published,
                    "a refused mark changed the row"
                );
            }
            fx.reader()
                .mark_published(&lease, &[first.id], clock.now_ms())
                .await?;
            ensure!(
                fx.row(first.id).await?.ok_or("row vanished")?.published,
                "a valid mark did not publish"
            );
            ensure!(
                fx.reader()
                    .pending(lane, 10)
                    .await?
                    .iter()
                    .all(|r| r.id != first.id),
                "marked row still pending"
            );

            let second = event("lease-1", 2);
            fx.enqueue(std::slice::from_ref(&second), TxEnd::Commit)
                .await?;
            fx.leases().release_all("r1").await?;
            let res = fx
                .reader()
                .mark_published(&lease, &[second.id], clock.now_ms())
                .await;
            ensure!(
                matches!(res, Err(StoreError::LeaseLost { .. })),
                "mark after release gave {res:?}"
            );
            ensure!(
                !fx.row(second.id).await?.ok_or("row vanished")?.published,
                "released lease marked a row"
            );
            Ok(())
        })
    })
    .await
}

/// Three owners balancing converge to disjoint fair shares that cover every lane.
pub async fn owners_converge_to_disjoint_lanes(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let owners = ["a", "b", "c"];
            let mut now = clock.now_ms();
            for round in 0..10 {
                let mut held: Vec<Vec<u32>> = Vec::new();
                for owner in owners {
                    let leases = fx.leases().balance(owner, now, TTL).await?;
                    ensure!(
                        leases.iter().all(|l| l.owner == owner),
                        "balance returned another owner's lease"
                    );
                    held.push(leases.iter().map(|l| l.lane).collect());
                }
                let mut seen = HashSet::new();
                for lanes in &held {
                    for lane in lanes {
                        ensure!(
                            seen.insert(*lane),
                            "round {round}: lane {lane} held twice: {held:?}"
                        );
                    }
                }
                let share = LANES.div_ceil(owners.len() as u32) as usize;
                ensure!(
                    held.iter().all(|l| l.len() <= share || round == 0),
                    "round {round}: above fair share"
                );
                if seen.len() == LANES as usize && held.iter().all(|l| l.len() <= share) {
                    return Ok(());
                }
                now += 1_000;
            }
            Err("three owners did not converge to cover every lane within 10 rounds".into())
        })
    })
    .await
}

/// An owner that stops heartbeating loses its lanes after the ttl; the taker's token grows
/// and the old owner's marks are refused.
pub async fn expired_owner_is_taken_over_and_fenced(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let e = event("takeover-1", 1);
            fx.enqueue(std::slice::from_ref(&e), TxEnd::Commit).await?;
            let lane = lane_of_row(fx, &e).await?;
            let t0 = clock.now_ms();
            let old = lease_for(fx, "a", lane, t0).await?;
            let early = fx.leases().balance("b", t0 + 1_000, TTL).await?;
            ensure!(early.is_empty(), "b took {} live lanes of a", early.len());
            let late = fx.leases().balance("b", t0 + TTL_MS + 1_000, TTL).await?;
            ensure!(
                late.len() == LANES as usize,
                "b took {} of a's expired lanes, not all",
                late.len()
            );
            let new = late
                .iter()
                .find(|l| l.lane == lane)
                .ok_or("lane not taken")?;
            ensure!(new.token > old.token, "takeover did not increase the token");
            let res = fx
                .reader()
                .mark_published(&old, &[e.id], t0 + TTL_MS + 2_000)
                .await;
            ensure!(
                matches!(res, Err(StoreError::LeaseLost { .. })),
                "expired owner's mark gave {res:?}"
            );
            ensure!(
                !fx.row(e.id).await?.ok_or("row vanished")?.published,
                "fenced mark changed the row"
            );
            fx.reader()
                .mark_published(new, &[e.id], t0 + TTL_MS + 2_000)
                .await?;
            ensure!(
                fx.row(e.id).await?.ok_or("row vanished")?.published,
                "new owner could not mark"
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
