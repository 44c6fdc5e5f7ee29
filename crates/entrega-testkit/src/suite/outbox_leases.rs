//! Outbox conformance, lane leases: fencing tokens, balancing among owners, takeover after
//! expiry. Every function is one scenario, run on a fresh outbox.

use std::collections::HashSet;

use entrega_core::{Clock, Holder, LaneLease, StoreError, LANES};

use super::outbox_support::{event, holder, lane_of_row, lease_for, run, TTL, TTL_MS};
use crate::ensure;
use crate::harness::{OutboxHarness, Scenario, TxEnd};

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
            fx.leases().release_all(&holder("r1")).await?;
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
                    let leases = fx.leases().balance(&holder(owner), now, TTL).await?;
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
            let early = fx.leases().balance(&holder("b"), t0 + 1_000, TTL).await?;
            ensure!(early.is_empty(), "b took {} live lanes of a", early.len());
            let late = fx
                .leases()
                .balance(&holder("b"), t0 + TTL_MS + 1_000, TTL)
                .await?;
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

/// An owner started again under its name (a restarted relay) takes its earlier life's lanes
/// at once, long before their leases end, with new tokens: the earlier life's marks are
/// refused, it finds itself superseded and holds nothing, and its release at shutdown leaves
/// the later life's lanes alone.
pub async fn restarted_owner_takes_its_lanes_back_at_once(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let e = event("restart-1", 1);
            fx.enqueue(std::slice::from_ref(&e), TxEnd::Commit).await?;
            let lane = lane_of_row(fx, &e).await?;
            let t0 = clock.now_ms();
            let (first, second) = (
                Holder::with_incarnation("r", 1),
                Holder::with_incarnation("r", 2),
            );
            let old = fx
                .leases()
                .balance(&first, t0, TTL)
                .await?
                .into_iter()
                .find(|l| l.lane == lane)
                .ok_or("the first life does not hold the row's lane")?;
            // A tenth into the first life's leases.
            let restarted = fx.leases().balance(&second, t0 + TTL_MS / 10, TTL).await?;
            ensure!(
                restarted.len() == LANES as usize,
                "the later life took {} of its {} lanes at once",
                restarted.len(),
                LANES
            );
            let new = restarted
                .iter()
                .find(|l| l.lane == lane)
                .ok_or("lane not taken back")?
                .clone();
            ensure!(new.token > old.token, "taking back did not bump the token");
            let res = fx
                .reader()
                .mark_published(&old, &[e.id], t0 + TTL_MS / 5)
                .await;
            ensure!(
                matches!(res, Err(StoreError::LeaseLost { .. })),
                "the earlier life's mark gave {res:?}"
            );
            ensure!(
                !fx.row(e.id).await?.ok_or("row vanished")?.published,
                "a fenced mark changed the row"
            );
            let stale = fx.leases().balance(&first, t0 + TTL_MS / 5, TTL).await?;
            ensure!(
                stale.is_empty(),
                "the superseded life still holds {} lanes",
                stale.len()
            );
            fx.leases().release_all(&first).await?;
            let kept = fx.leases().balance(&second, t0 + TTL_MS / 4, TTL).await?;
            ensure!(
                kept.len() == LANES as usize
                    && kept
                        .iter()
                        .any(|l| l.lane == new.lane && l.token == new.token),
                "the earlier life's release took lanes from the later one: {} held",
                kept.len()
            );
            fx.reader()
                .mark_published(&new, &[e.id], t0 + TTL_MS / 4)
                .await?;
            ensure!(
                fx.row(e.id).await?.ok_or("row vanished")?.published,
                "the later life could not mark"
            );
            Ok(())
        })
    })
    .await
}
