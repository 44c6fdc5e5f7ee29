//! Draining the held lanes together, in pipelined rounds.
//!
//! A round reads up to a batch of every lane, publishes everything read in one call, and marks
//! it under each lane's lease. Rounds overlap: while round N's publish waits for the broker,
//! round N−1 is marked and round N+1 is read from the lanes that filled their batch in round N,
//! past the rows still in flight (a cursor per lane). The mark and the read run at once, on two
//! connections (they touch disjoint rows); the broker sees one publish at a time.
//!
//! Order and safety are those of sequential rounds:
//! * a round is published only after the round before it was confirmed, so a lane's rows
//!   reach the transport in insertion order;
//! * rows are marked only after their publish was confirmed;
//! * a lane whose lease ran out is not published; one whose mark found the lease lost is
//!   dropped before anything more of it is marked;
//! * after any failure the pipeline drains: what was confirmed is marked where it can be,
//!   everything else stays pending and is published again, with the same `id_evento`.

use entrega_core::{LaneCursor, LaneLease, LaneMark, LaneRows, OutboxRow};

use super::drain::LaneError;
use super::Relay;
use crate::relay_config::bump;

/// What the rounds of one pass did.
#[derive(Debug, Default)]
pub(super) struct Rounds {
    /// Events published and marked.
    pub(super) published: usize,
    /// Lanes that failed, with why; nothing of them past their last marked round was marked.
    pub(super) failed: Vec<(u32, LaneError)>,
}

impl Rounds {
    pub(super) fn fail(
        &mut self,
        lanes: impl IntoIterator<Item = u32>,
        error: impl Fn() -> LaneError,
    ) {
        for lane in lanes {
            self.fail_with(lane, error());
        }
    }

    /// Records `lane` as failed with `error`, unless it already failed.
    pub(super) fn fail_with(&mut self, lane: u32, error: LaneError) {
        if !self.failed.iter().any(|(l, _)| *l == lane) {
            self.failed.push((lane, error));
        }
    }

    /// Adds what another part of the pass did.
    fn absorb(&mut self, other: Rounds) {
        self.published += other.published;
        for (lane, error) in other.failed {
            self.fail_with(lane, error);
        }
    }
}

/// Rows read for one round.
type Read = Vec<LaneRows>;

impl Rounds {
    /// Keeps only the lanes that have not failed.
    fn retain_live(&self, read: &mut Read) {
        read.retain(|f| !self.failed.iter().any(|(l, _)| *l == f.lane));
    }
}

impl Relay {
    /// Drains `leases` in pipelined rounds until no lane has a full batch waiting or a failure
    /// stops the pipeline.
    pub(super) async fn rounds(&self, leases: &[LaneLease]) -> Rounds {
        let mut out = Rounds::default();
        let lanes: Vec<u32> = leases.iter().map(|l| l.lane).collect();
        let mut current: Read = match self
            .ports
            .reader
            .pending_lanes(&lanes, self.config.batch_size)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                let error = LaneError::from(e);
                tracing::warn!(lanes = lanes.len(), %error, "relay round failed");
                let lease_lost = matches!(error, LaneError::LeaseLost);
                out.fail(lanes, || lane_error(lease_lost));
                return out;
            }
        };
        // Published and confirmed, waiting to be marked.
        let mut confirmed: Option<Read> = None;
        loop {
            self.drop_expired(leases, &mut current, &mut out);
            if current.is_empty() && confirmed.is_none() {
                return out;
            }
            // Lanes that filled their batch may have more waiting: read on past their rows.
            let cursors: Vec<LaneCursor> = current
                .iter()
                .filter(|f| f.rows.len() >= self.config.batch_size)
                .filter_map(|f| {
                    f.rows.last().map(|r| LaneCursor {
                        lane: f.lane,
                        after_seq: r.seq,
                    })
                })
                .collect();
            let publish = self.publish_round(&current);
            // The mark of round N−1 and the read of round N+1 touch disjoint rows (the read
            // starts past every row in flight), so they run at once, on two connections.
            // After a failed mark the pipeline stops and what was read is dropped.
            let mark = async {
                match &confirmed {
                    Some(read) => Some(self.mark_round(leases, read).await),
                    None => None,
                }
            };
            let read = async {
                if cursors.is_empty() {
                    Ok(Vec::new())
                } else {
                    self.ports
                        .reader
                        .pending_lanes_after(&cursors, self.config.batch_size)
                        .await
                }
            };
            let database = async { tokio::join!(mark, read) };
            let (published, (marked, next)) = tokio::join!(publish, database);

            let mut stop = false;
            if let (Some(read), Some(marked)) = (confirmed.take(), marked) {
                match marked {
                    Ok(lost) => {
                        self.count_marked(&read, &lost, &mut out);
                        out.fail(lost.iter().copied(), || LaneError::LeaseLost);
                    }
                    Err(error) => {
                        tracing::warn!(lanes = read.len(), %error, "relay round failed");
                        let lease_lost = matches!(error, LaneError::LeaseLost);
                        out.fail(read.iter().map(|f| f.lane), || lane_error(lease_lost));
                        stop = true;
                    }
                }
            }
            match published {
                Ok(()) if !stop => {
                    // Nothing more of a failed lane (say, its lease lost) is marked.
                    out.retain_live(&mut current);
                    confirmed = (!current.is_empty()).then_some(current);
                }
                Ok(()) => {
                    // Published but not to be marked now: the lanes go again after a backoff.
                    out.fail(current.iter().map(|f| f.lane), || LaneError::Round);
                }
                Err(LaneError::Publish(error)) if !error.is_transient() => {
                    // Refused for good: find the refused rows, publish the rest, then stop.
                    tracing::warn!(lanes = current.len(), %error, "relay round refused");
                    out.retain_live(&mut current);
                    let narrowed = self.isolate(leases, &current).await;
                    out.absorb(narrowed);
                    stop = true;
                }
                Err(error) => {
                    tracing::warn!(lanes = current.len(), %error, "relay round failed");
                    let lease_lost = matches!(error, LaneError::LeaseLost);
                    out.fail(current.iter().map(|f| f.lane), || lane_error(lease_lost));
                    stop = true;
                }
            }
            current = match next {
                Ok(next) if !stop => next,
                Ok(_) => Vec::new(),
                Err(e) => {
                    let error = LaneError::from(e);
                    tracing::warn!(lanes = cursors.len(), %error, "relay round failed");
                    let lease_lost = matches!(error, LaneError::LeaseLost);
                    out.fail(cursors.iter().map(|c| c.lane), || lane_error(lease_lost));
                    Vec::new()
                }
            };
            // Nothing more of a failed lane is published.
            out.retain_live(&mut current);
        }
    }

    /// Leaves out the lanes whose lease ran out: another instance may own them by now, and
    /// publishing could reorder them.
    fn drop_expired(&self, leases: &[LaneLease], read: &mut Read, out: &mut Rounds) {
        let now = self.clock.now_ms();
        read.retain(|f| {
            let live = leases
                .iter()
                .any(|l| l.lane == f.lane && now < l.expires_at_ms);
            if !live {
                out.fail([f.lane], || LaneError::LeaseLost);
            }
            live
        });
    }

    /// Publishes a round in one call; `Ok` only once the transport confirmed all of it.
    async fn publish_round(&self, read: &Read) -> Result<(), LaneError> {
        if read.is_empty() {
            return Ok(());
        }
        let rows: Vec<&OutboxRow> = read.iter().flat_map(|f| f.rows.iter()).collect();
        self.publish(&rows).await
    }

    /// Marks a confirmed round, each lane under its own lease; returns the lanes whose lease
    /// was lost (their rows stay pending).
    async fn mark_round(&self, leases: &[LaneLease], read: &Read) -> Result<Vec<u32>, LaneError> {
        let marks: Vec<LaneMark> = read
            .iter()
            .filter_map(|f| {
                // Every lane read was asked for, so its lease is among `leases`.
                leases
                    .iter()
                    .find(|l| l.lane == f.lane)
                    .map(|lease| LaneMark {
                        lease: lease.clone(),
                        ids: f.rows.iter().map(|r| r.id).collect(),
                    })
            })
            .collect();
        Ok(self
            .ports
            .reader
            .mark_published_lanes(&marks, self.clock.now_ms())
            .await?)
    }

    fn count_marked(&self, read: &Read, lost: &[u32], out: &mut Rounds) {
        for f in read.iter().filter(|f| !lost.contains(&f.lane)) {
            out.published += f.rows.len();
            bump(&self.stats.published, f.rows.len() as u64);
            bump(&self.stats.batches, 1);
        }
    }
}

/// The error a lane of a failed round is settled with: the round's cause is logged once.
pub(super) fn lane_error(lease_lost: bool) -> LaneError {
    if lease_lost {
        LaneError::LeaseLost
    } else {
        LaneError::Round
    }
}
