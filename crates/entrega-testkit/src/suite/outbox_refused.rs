//! Outbox conformance, rows the transport refused: a refused row blocks its own aggregate
//! (and only it) until its next attempt is due, holds when told to until released, and the
//! refusal is fenced by the lane's lease like marking. Every function is one scenario, run on
//! a fresh outbox.

use entrega_core::{
    BlockedRow, Clock, LaneCursor, LaneLease, NewEvent, OutboxRow, Refusal, ReleaseError,
    StoreError,
};
use uuid::Uuid;

use super::outbox_support::{event, lane_of_row, lease_for, run};
use crate::ensure;
use crate::harness::{BoxError, OutboxFixture, OutboxHarness, Scenario, TxEnd};

/// How far ahead a refused row's next attempt is set.
const RETRY_IN_MS: i64 = 60_000;

/// Rows of `aggregate_id` among `rows`, by id, in the order given.
fn of(rows: &[OutboxRow], aggregate_id: &str) -> Vec<Uuid> {
    rows.iter()
        .filter(|r| r.aggregate_id == aggregate_id)
        .map(|r| r.id)
        .collect()
}

fn ids(events: &[NewEvent]) -> Vec<Uuid> {
    events.iter().map(|e| e.id).collect()
}

/// Three events of `blocked-x` and two of another aggregate in the same lane, committed in
/// interleaved transactions; returns the lane, x's events and the other's.
async fn two_aggregates_in_one_lane(
    fx: &dyn OutboxFixture,
) -> Result<(u32, Vec<NewEvent>, Vec<NewEvent>), BoxError> {
    let x: Vec<NewEvent> = (0..3).map(|n| event("blocked-x", n)).collect();
    fx.enqueue(&x[..1], TxEnd::Commit).await?;
    let lane = lane_of_row(fx, &x[0]).await?;
    // Lanes are the backend's hash of the aggregate id: probe ids until one shares x's lane.
    let mut n = 0;
    let first_y = loop {
        let probe = event(&format!("blocked-y{n}"), 0);
        fx.enqueue(std::slice::from_ref(&probe), TxEnd::Commit)
            .await?;
        if lane_of_row(fx, &probe).await? == lane {
            break probe;
        }
        n += 1;
        ensure!(n < 5_000, "no aggregate found in lane {lane}");
    };
    let y = vec![first_y.clone(), event(&first_y.aggregate_id, 1)];
    fx.enqueue(&x[1..2], TxEnd::Commit).await?;
    fx.enqueue(&y[1..], TxEnd::Commit).await?;
    fx.enqueue(&x[2..], TxEnd::Commit).await?;
    Ok((lane, x, y))
}

/// The rows every pending read gives for `lane`, checked to agree with each other.
async fn pending_everywhere(fx: &dyn OutboxFixture, lane: u32) -> Result<Vec<OutboxRow>, BoxError> {
    let single = fx.reader().pending(lane, 100).await?;
    let many: Vec<OutboxRow> = fx
        .reader()
        .pending_lanes(&[lane], 100)
        .await?
        .into_iter()
        .flat_map(|f| f.rows)
        .collect();
    let cursor = LaneCursor {
        lane,
        after_seq: i64::MIN,
    };
    let after: Vec<OutboxRow> = fx
        .reader()
        .pending_lanes_after(&[cursor], 100)
        .await?
        .into_iter()
        .flat_map(|f| f.rows)
        .collect();
    ensure!(
        single == many && single == after,
        "pending reads disagree: {single:?} / {many:?} / {after:?}"
    );
    Ok(single)
}

async fn blocked(fx: &dyn OutboxFixture, now: i64) -> Result<Vec<BlockedRow>, BoxError> {
    Ok(fx.maintenance().status(now).await?.blocked)
}

/// A refused row keeps its aggregate (all of it) out of the pending reads until its next
/// attempt is due, while the lane's other aggregate flows; the row carries attempts, next
/// attempt and last error; once due it comes back first, its aggregate in order.
pub async fn refused_row_holds_back_only_its_aggregate(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (lane, x, y) = two_aggregates_in_one_lane(fx).await?;
            let lease = lease_for(fx, "r", lane, clock.now_ms()).await?;
            let before = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&before, "blocked-x") == ids(&x),
                "x not pending at first"
            );
            ensure!(
                before.iter().all(|r| r.attempts == 0),
                "fresh rows with attempts"
            );

            let now = clock.now_ms();
            let retry_at = now + RETRY_IN_MS;
            let refusal = Refusal::retry(x[0].id, "message too large", retry_at);
            fx.reader().record_refusal(&lease, &refusal, now).await?;
            let during = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&during, "blocked-x").is_empty(),
                "rows of the blocked aggregate are read: {during:?}"
            );
            ensure!(
                of(&during, &y[0].aggregate_id) == ids(&y),
                "the lane's other aggregate does not flow: {during:?}"
            );
            let status = fx.maintenance().status(now).await?;
            ensure!(
                status.retrying == 1 && status.held == 0,
                "status while retrying: {status:?}"
            );
            let row = status
                .blocked
                .first()
                .ok_or("the refused row is not listed")?;
            ensure!(
                row.id == x[0].id
                    && row.aggregate_id == "blocked-x"
                    && row.kind == x[0].kind
                    && row.attempts == 1
                    && row
                        .next_attempt_ms
                        .is_some_and(|t| (t - retry_at).abs() <= 1)
                    && row.last_error.as_deref() == Some("message too large")
                    && !row.is_held(),
                "refused row as listed: {row:?}"
            );

            clock.advance(RETRY_IN_MS - 1_000);
            let still = pending_everywhere(fx, lane).await?;
            ensure!(of(&still, "blocked-x").is_empty(), "read before it is due");
            clock.advance(2_000);
            let due = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&due, "blocked-x") == ids(&x),
                "once due, x is not back in order: {due:?}"
            );
            let head = due.iter().find(|r| r.id == x[0].id).ok_or("x0 missing")?;
            ensure!(
                head.attempts == 1,
                "the due row lost its attempts: {head:?}"
            );
            // A second refusal counts on.
            let now = clock.now_ms();
            let again = Refusal::retry(x[0].id, "still too large", now + RETRY_IN_MS);
            fx.reader().record_refusal(&lease, &again, now).await?;
            let listed = blocked(fx, now).await?;
            ensure!(
                listed.len() == 1
                    && listed[0].attempts == 2
                    && listed[0].last_error.as_deref() == Some("still too large"),
                "second refusal: {listed:?}"
            );
            Ok(())
        })
    })
    .await
}

/// A row refused in the middle of its aggregate holds back its later rows, not its earlier
/// ones, nor rows of the aggregate that went out before it.
pub async fn refused_row_keeps_its_aggregate_in_order(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (lane, x, y) = two_aggregates_in_one_lane(fx).await?;
            let lease = lease_for(fx, "r", lane, clock.now_ms()).await?;
            let now = clock.now_ms();
            fx.reader().mark_published(&lease, &[x[0].id], now).await?;
            let refusal = Refusal::retry(x[1].id, "unknown topic", now + RETRY_IN_MS);
            fx.reader().record_refusal(&lease, &refusal, now).await?;
            let during = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&during, "blocked-x").is_empty(),
                "x's rows after its refused row are read: {during:?}"
            );
            ensure!(
                of(&during, &y[0].aggregate_id) == ids(&y),
                "y does not flow"
            );
            let seqs: Vec<i64> = during.iter().map(|r| r.seq).collect();
            ensure!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "out of order: {seqs:?}"
            );
            clock.advance(RETRY_IN_MS + 1);
            let due = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&due, "blocked-x") == ids(&x[1..]),
                "after the retry time x is not back in order: {due:?}"
            );
            Ok(())
        })
    })
    .await
}

/// A held row stays out of the pending reads however much time passes, with its aggregate;
/// releasing it brings it back first. Releasing an unknown row or one that is not held
/// fails, changing nothing.
pub async fn held_row_waits_for_release(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (lane, x, y) = two_aggregates_in_one_lane(fx).await?;
            let lease = lease_for(fx, "r", lane, clock.now_ms()).await?;
            let parked_at = clock.now_ms();
            let hold = Refusal::hold(x[0].id, "message too large");
            fx.reader().record_refusal(&lease, &hold, parked_at).await?;
            clock.advance(7 * 24 * 3_600_000);
            let later = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&later, "blocked-x").is_empty(),
                "a held row's aggregate is read: {later:?}"
            );
            ensure!(of(&later, &y[0].aggregate_id) == ids(&y), "y does not flow");
            let status = fx.maintenance().status(clock.now_ms()).await?;
            ensure!(
                status.held == 1 && status.retrying == 0,
                "status while held: {status:?}"
            );
            let row = status.blocked.first().ok_or("the held row is not listed")?;
            ensure!(
                row.id == x[0].id
                    && row.attempts == 1
                    && row.next_attempt_ms.is_none()
                    && row.held_at_ms.is_some_and(|t| (t - parked_at).abs() <= 1),
                "held row as listed: {row:?}"
            );

            let unknown = Uuid::new_v4();
            let err = fx.maintenance().release(unknown).await;
            ensure!(
                matches!(&err, Err(ReleaseError::UnknownRow { id }) if *id == unknown),
                "release of an unknown row: {err:?}"
            );
            let err = fx.maintenance().release(y[0].id).await;
            ensure!(
                matches!(&err, Err(ReleaseError::NotHeld { id }) if *id == y[0].id),
                "release of a flowing row: {err:?}"
            );
            ensure!(
                blocked(fx, clock.now_ms()).await? == status.blocked,
                "a failed release changed something"
            );

            fx.maintenance().release(x[0].id).await?;
            let back = pending_everywhere(fx, lane).await?;
            ensure!(
                of(&back, "blocked-x") == ids(&x),
                "released row not back ahead of its aggregate: {back:?}"
            );
            ensure!(
                back.iter().find(|r| r.id == x[0].id).map(|r| r.attempts) == Some(1),
                "a release lost the attempts"
            );
            let status = fx.maintenance().status(clock.now_ms()).await?;
            ensure!(
                status.held == 0 && status.retrying == 0 && status.blocked.is_empty(),
                "status after release: {status:?}"
            );
            let err = fx.maintenance().release(x[0].id).await;
            ensure!(
                matches!(err, Err(ReleaseError::NotHeld { .. })),
                "a second release: {err:?}"
            );
            Ok(())
        })
    })
    .await
}

/// Recording a refusal under a lease that is no longer held changes nothing and reports the
/// lease lost; a refusal naming a row of another lane, or a published row, changes nothing.
pub async fn refusal_requires_valid_lease(h: &dyn OutboxHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (lane, x, y) = two_aggregates_in_one_lane(fx).await?;
            let lease = lease_for(fx, "r", lane, clock.now_ms()).await?;
            let stale = LaneLease {
                token: lease.token + 1,
                ..lease.clone()
            };
            let now = clock.now_ms();
            let hold = Refusal::hold(x[0].id, "message too large");
            let err = fx.reader().record_refusal(&stale, &hold, now).await;
            ensure!(
                matches!(err, Err(StoreError::LeaseLost { .. })),
                "a stale lease recorded a refusal: {err:?}"
            );
            ensure!(
                blocked(fx, now).await?.is_empty(),
                "a fenced refusal was written"
            );

            // Under a lease of another lane the row is not that lease's to touch.
            let other = event("blocked-elsewhere", 0);
            fx.enqueue(std::slice::from_ref(&other), TxEnd::Commit)
                .await?;
            let other_lane = lane_of_row(fx, &other).await?;
            if other_lane != lane {
                let other_lease = lease_for(fx, "r", other_lane, now).await?;
                fx.reader().record_refusal(&other_lease, &hold, now).await?;
                ensure!(
                    blocked(fx, now).await?.is_empty(),
                    "a lease refused another lane's row"
                );
            }
            fx.reader().mark_published(&lease, &[y[0].id], now).await?;
            let published = Refusal::hold(y[0].id, "late");
            fx.reader().record_refusal(&lease, &published, now).await?;
            ensure!(
                blocked(fx, now).await?.is_empty(),
                "a published row was refused"
            );
            let pending = pending_everywhere(fx, lane).await?;
            ensure!(of(&pending, "blocked-x") == ids(&x), "x stopped flowing");
            Ok(())
        })
    })
    .await
}
