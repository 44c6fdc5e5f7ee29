//! Narrowing a publish the transport refused for good down to the rows it refuses.
//!
//! A permanent refusal (message too large, unknown topic) of a batch says nothing about which
//! message caused it. The rows are published again in halves, in order: a prefix the
//! transport confirms is marked; a prefix it refuses is halved again, until a single row is
//! refused alone. That row gets a refusal recorded (attempts, next attempt or holding, last
//! error) and leaves the batch together with every later row of its aggregate, which must
//! not overtake it; the lane's other aggregates go on. A transient error (broker down) ends
//! the narrowing without blaming any row: the lanes left back off as after any failed
//! publish.
//!
//! Only prefixes are published, so no row reaches the transport before the rows ahead of it
//! in its lane were either confirmed or left out as refused (or behind a refused row).

use std::collections::VecDeque;

use entrega_core::{LaneLease, LaneMark, LaneRows, OutboxRow, Refusal};

use super::drain::LaneError;
use super::rounds::Rounds;
use super::Relay;
use crate::relay_config::{bump, millis};

/// Rows still to publish, each with its lane, in publish order.
type Queue<'a> = VecDeque<(u32, &'a OutboxRow)>;

impl Relay {
    /// Publishes `read` after a publish of it was refused for good, narrowing the refusal down
    /// to single rows; see the module docs. Lanes absent from `leases` are left alone.
    pub(super) async fn isolate(&self, leases: &[LaneLease], read: &[LaneRows]) -> Rounds {
        let mut out = Rounds::default();
        let mut queue: Queue<'_> = read
            .iter()
            .flat_map(|f| f.rows.iter().map(move |r| (f.lane, r)))
            .collect();
        let mut size = queue.len();
        while !queue.is_empty() {
            self.drop_expired_rows(leases, &mut queue, &mut out);
            if queue.is_empty() {
                break;
            }
            size = size.clamp(1, queue.len());
            let chunk: Vec<(u32, &OutboxRow)> = queue.iter().take(size).copied().collect();
            let rows: Vec<&OutboxRow> = chunk.iter().map(|(_, r)| *r).collect();
            match self.publish(&rows).await {
                Ok(()) => {
                    queue.drain(..size);
                    if let Err(error) = self.mark_rows(leases, &chunk, &mut queue, &mut out).await {
                        fail_all(&mut queue, &chunk, error, &mut out);
                        return out;
                    }
                    size = queue.len();
                }
                Err(LaneError::Publish(e)) if !e.is_transient() && size > 1 => {
                    // Somewhere in the chunk: try its first half alone.
                    size /= 2;
                }
                Err(LaneError::Publish(e)) if !e.is_transient() => {
                    if let Some((lane, row)) = queue.pop_front() {
                        queue.retain(|(l, r)| !(*l == lane && r.aggregate_id == row.aggregate_id));
                        self.refuse(leases, lane, row, &e.to_string(), &mut queue, &mut out)
                            .await;
                    }
                    size = queue.len();
                }
                Err(error) => {
                    tracing::warn!(%error, "relay publish failed while narrowing a refusal");
                    fail_all(&mut queue, &[], error, &mut out);
                    return out;
                }
            }
        }
        out
    }

    /// Records that the transport refused `row` alone: retried later by the backoff of its
    /// attempt count, or held at the attempt limit.
    async fn refuse(
        &self,
        leases: &[LaneLease],
        lane: u32,
        row: &OutboxRow,
        error: &str,
        queue: &mut Queue<'_>,
        out: &mut Rounds,
    ) {
        let Some(lease) = leases.iter().find(|l| l.lane == lane) else {
            return;
        };
        let attempts = row.attempts.saturating_add(1);
        let now = self.clock.now_ms();
        let refusal = if attempts >= self.config.max_attempts {
            Refusal::hold(row.id, error)
        } else {
            let delay = self.config.backoff.delay(attempts);
            Refusal::retry(row.id, error, now.saturating_add(millis(delay)))
        };
        match self.ports.reader.record_refusal(lease, &refusal, now).await {
            Ok(()) if refusal.holds() => {
                bump(&self.stats.refused, 1);
                bump(&self.stats.held, 1);
                tracing::error!(
                    lane, id = %row.id, aggregate_id = %row.aggregate_id, kind = %row.kind,
                    attempts, %error,
                    "outbox row held: the transport refused it at every attempt; its \
                     aggregate waits until it is released"
                );
            }
            Ok(()) => {
                bump(&self.stats.refused, 1);
                tracing::warn!(
                    lane, id = %row.id, aggregate_id = %row.aggregate_id, attempts, %error,
                    retry_at_ms = ?refusal.retry_at_ms,
                    "outbox row refused by the transport; its aggregate waits for the retry"
                );
            }
            Err(e) => {
                let error = LaneError::from(e);
                tracing::warn!(lane, %error, "recording a refused outbox row failed");
                queue.retain(|(l, _)| *l != lane);
                out.fail_with(lane, error);
            }
        }
    }

    /// Marks confirmed rows under their lanes' leases; a lane whose lease was lost is dropped
    /// from `queue` and failed.
    async fn mark_rows(
        &self,
        leases: &[LaneLease],
        rows: &[(u32, &OutboxRow)],
        queue: &mut Queue<'_>,
        out: &mut Rounds,
    ) -> Result<(), LaneError> {
        let mut marks: Vec<LaneMark> = Vec::new();
        for (lane, row) in rows {
            match marks.iter_mut().find(|m| m.lease.lane == *lane) {
                Some(mark) => mark.ids.push(row.id),
                None => {
                    if let Some(lease) = leases.iter().find(|l| l.lane == *lane) {
                        marks.push(LaneMark {
                            lease: lease.clone(),
                            ids: vec![row.id],
                        });
                    }
                }
            }
        }
        let lost = self
            .ports
            .reader
            .mark_published_lanes(&marks, self.clock.now_ms())
            .await?;
        for mark in marks.iter().filter(|m| !lost.contains(&m.lease.lane)) {
            out.published += mark.ids.len();
            bump(&self.stats.published, mark.ids.len() as u64);
            bump(&self.stats.batches, 1);
        }
        queue.retain(|(l, _)| !lost.contains(l));
        out.fail(lost, || LaneError::LeaseLost);
        Ok(())
    }

    /// Leaves out the rows of lanes whose lease ran out: another instance may own them now.
    fn drop_expired_rows(&self, leases: &[LaneLease], queue: &mut Queue<'_>, out: &mut Rounds) {
        let now = self.clock.now_ms();
        let expired: Vec<u32> = leases
            .iter()
            .filter(|l| now >= l.expires_at_ms)
            .map(|l| l.lane)
            .filter(|lane| queue.iter().any(|(l, _)| l == lane))
            .collect();
        queue.retain(|(l, _)| !expired.contains(l));
        out.fail(expired, || LaneError::LeaseLost);
    }
}

/// Fails every lane still in `queue` or in `chunk`: the first with `error`, the others as
/// part of the same failure.
fn fail_all(
    queue: &mut Queue<'_>,
    chunk: &[(u32, &OutboxRow)],
    error: LaneError,
    out: &mut Rounds,
) {
    let lease_lost = matches!(error, LaneError::LeaseLost);
    let mut error = Some(error);
    for (lane, _) in chunk.iter().chain(queue.iter()) {
        let this = error
            .take()
            .unwrap_or_else(|| super::rounds::lane_error(lease_lost));
        out.fail_with(*lane, this);
    }
    queue.clear();
}
