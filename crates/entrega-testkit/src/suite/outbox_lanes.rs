//! Outbox conformance, several lanes at once: `pending_lanes` returns what `pending` returns
//! lane by lane, and `mark_published_lanes` fences every lane by its own lease. Every function
//! is one scenario, run on a fresh outbox.

use entrega_core::{Clock, LaneCursor, LaneLease, LaneMark, NewEvent, OutboxRow};

use super::outbox_support::{event, holder, lane_of_row, run, TTL};
use crate::ensure;
use crate::harness::{BoxError, OutboxFixture, OutboxHarness, Scenario, TxEnd};

fn ids(rows: &[OutboxRow]) -> Vec<uuid::Uuid> {
    rows.iter().map(|r| r.id).collect()
}

/// Events of aggregates `agg-0`, `agg-1`, ... until `lanes` distinct lanes are covered,
/// `per` events each, committed; returns the lanes in the order first seen.
async fn fill_lanes(fx: &dyn OutboxFixture, lanes: usize, per: u32) -> Result<Vec<u32>, BoxError> {
    let mut seen = Vec::new();
    let mut n = 0;
    while seen.len() < lanes {
        let events: Vec<NewEvent> = (0..per).map(|i| event(&format!("agg-{n}"), i)).collect();
        fx.enqueue(&events, TxEnd::Commit).await?;
        let lane = lane_of_row(fx, &events[0]).await?;
        if !seen.contains(&lane) {
            seen.push(lane);
        }
        n += 1;
        ensure!(n < 10_000, "could not cover {lanes} lanes");
    }
    Ok(seen)
}

/// `pending_lanes` gives, for each asked lane with pending rows and in the order asked, the
/// same rows as `pending` on that lane; empty and unasked lanes are left out.
pub async fn pending_lanes_matches_each_lane(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let filled = fill_lanes(fx, 6, 3).await?;
            let held = fx
                .leases()
                .balance(&holder("r"), clock.now_ms(), TTL)
                .await?;
            let mut all: Vec<u32> = held.iter().map(|l| l.lane).collect();
            all.reverse();
            let found = fx.reader().pending_lanes(&all, 2).await?;
            let mut want = Vec::new();
            for &lane in &all {
                let rows = fx.reader().pending(lane, 2).await?;
                if !rows.is_empty() {
                    want.push((lane, ids(&rows)));
                }
            }
            let got: Vec<(u32, Vec<uuid::Uuid>)> =
                found.iter().map(|f| (f.lane, ids(&f.rows))).collect();
            ensure!(
                got == want,
                "pending_lanes gave {got:?}, lane by lane gave {want:?}"
            );
            ensure!(
                filled.iter().all(|l| got.iter().any(|(g, _)| g == l)),
                "a lane with pending rows is missing: {filled:?} vs {got:?}"
            );
            for f in &found {
                let seqs: Vec<i64> = f.rows.iter().map(|r| r.seq).collect();
                ensure!(
                    seqs.windows(2).all(|w| w[0] < w[1]),
                    "lane {} out of insertion order: {seqs:?}",
                    f.lane
                );
            }

            let some = &filled[..2];
            let found = fx.reader().pending_lanes(some, 10).await?;
            let lanes: Vec<u32> = found.iter().map(|f| f.lane).collect();
            ensure!(lanes == some, "asked {some:?}, got lanes {lanes:?}");
            ensure!(
                fx.reader().pending_lanes(&[], 10).await?.is_empty(),
                "no lanes asked, rows returned"
            );
            Ok(())
        })
    })
    .await
}

/// `mark_published_lanes` marks the rows of lanes whose lease holds and reports, untouched,
/// the lanes whose lease does not.
pub async fn mark_lanes_fences_each_lane(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let filled = fill_lanes(fx, 2, 2).await?;
            let (x, y) = (filled[0], filled[1]);
            let held = fx
                .leases()
                .balance(&holder("r"), clock.now_ms(), TTL)
                .await?;
            let lease = |lane: u32| -> Result<LaneLease, BoxError> {
                Ok(held
                    .iter()
                    .find(|l| l.lane == lane)
                    .ok_or("lane not held after balancing alone")?
                    .clone())
            };
            let (lease_x, lease_y) = (lease(x)?, lease(y)?);
            let stale_y = LaneLease {
                token: lease_y.token + 1,
                ..lease_y.clone()
            };
            let rows_x = ids(&fx.reader().pending(x, 10).await?);
            let rows_y = ids(&fx.reader().pending(y, 10).await?);
            ensure!(!rows_x.is_empty() && !rows_y.is_empty(), "no rows to mark");
            let marks = [
                LaneMark {
                    lease: lease_x,
                    ids: rows_x.clone(),
                },
                LaneMark {
                    lease: stale_y,
                    ids: rows_y.clone(),
                },
            ];
            let lost = fx
                .reader()
                .mark_published_lanes(&marks, clock.now_ms())
                .await?;
            ensure!(lost == vec![y], "lost lanes {lost:?}, expected [{y}]");
            for id in &rows_x {
                ensure!(
                    fx.row(*id).await?.ok_or("row vanished")?.published,
                    "a row of the held lane was not marked"
                );
            }
            for id in &rows_y {
                ensure!(
                    !fx.row(*id).await?.ok_or("row vanished")?.published,
                    "a fenced lane's row was marked"
                );
            }
            // Rows of one lane named under another lane's lease are not that lease's to mark.
            let crossed = [LaneMark {
                lease: lease(x)?,
                ids: rows_y.clone(),
            }];
            fx.reader()
                .mark_published_lanes(&crossed, clock.now_ms())
                .await?;
            ensure!(
                fx.reader().pending(y, 10).await?.len() == rows_y.len(),
                "a lease marked rows of another lane"
            );
            let marks = [LaneMark {
                lease: lease_y,
                ids: rows_y.clone(),
            }];
            let lost = fx
                .reader()
                .mark_published_lanes(&marks, clock.now_ms())
                .await?;
            ensure!(lost.is_empty(), "a held lane reported lost: {lost:?}");
            ensure!(
                fx.reader().pending(y, 10).await?.is_empty(),
                "rows still pending after a valid mark"
            );
            Ok(())
        })
    })
    .await
}

/// `pending_lanes_after` reads each lane on past its cursor: the same rows as `pending`
/// would give once the rows up to the cursor were gone, in the order of the cursors; a lane
/// with nothing past its cursor is left out.
pub async fn pending_lanes_after_reads_past_the_cursor(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let filled = fill_lanes(fx, 3, 5).await?;
            let (a, b, c) = (filled[0], filled[1], filled[2]);
            let all = |lane: u32| async move { fx.reader().pending(lane, 100).await };
            let (rows_a, rows_b) = (all(a).await?, all(b).await?);
            ensure!(
                rows_a.len() >= 5 && rows_b.len() >= 5,
                "filled lanes have too few rows"
            );
            let cursors = [
                LaneCursor {
                    lane: c,
                    after_seq: i64::MIN,
                },
                LaneCursor {
                    lane: a,
                    after_seq: rows_a[1].seq,
                },
                LaneCursor {
                    lane: b,
                    after_seq: rows_b[rows_b.len() - 1].seq,
                },
            ];
            let found = fx.reader().pending_lanes_after(&cursors, 2).await?;
            let got: Vec<(u32, Vec<uuid::Uuid>)> =
                found.iter().map(|f| (f.lane, ids(&f.rows))).collect();
            let want = vec![
                (c, ids(&fx.reader().pending(c, 2).await?)),
                (a, ids(&rows_a[2..4])),
            ];
            ensure!(got == want, "after the cursors got {got:?}, want {want:?}");

            // Rows up to the cursor being marked meanwhile changes nothing past it.
            let held = fx
                .leases()
                .balance(&holder("r"), clock.now_ms(), TTL)
                .await?;
            let lease_a = held
                .iter()
                .find(|l| l.lane == a)
                .ok_or("lane not held after balancing alone")?;
            fx.reader()
                .mark_published(lease_a, &ids(&rows_a[..2]), clock.now_ms())
                .await?;
            let past = fx.reader().pending_lanes_after(&cursors[1..2], 100).await?;
            let past: Vec<uuid::Uuid> = past.iter().flat_map(|f| ids(&f.rows)).collect();
            ensure!(
                past == ids(&rows_a[2..]),
                "past the cursor of lane {a}: {past:?}"
            );
            ensure!(
                fx.reader()
                    .pending_lanes_after(&cursors, 0)
                    .await?
                    .is_empty(),
                "a limit of 0 returned rows"
            );
            Ok(())
        })
    })
    .await
}
