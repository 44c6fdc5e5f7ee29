//! Draining lanes: together in rounds (one read, one publish, one fenced mark for every held
//! lane), or one lane alone, batch by batch, while it recovers from a failure.
//!
//! A round costs the same few round trips whether one lane or sixty-four have rows waiting,
//! which keeps an idle relay cheap and a busy one fast. Per-aggregate order holds within a
//! round: a lane's rows are read in insertion order and published in that order, and a lane's
//! next rows are read only after these are marked.

use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{
    Headers, LaneLease, LaneMark, OutboxRow, OutgoingMessage, StoreError, TransportError,
};

use super::Relay;
use crate::failpoint::{self, FailpointError};
use crate::relay_config::bump;

/// Why one lane could not be drained; the lane is retried later, the others go on.
#[derive(Debug, thiserror::Error)]
pub(super) enum LaneError {
    #[error("reading or marking rows failed: {0}")]
    Store(#[source] StoreError),
    #[error("publishing failed: {0}")]
    Publish(#[source] TransportError),
    #[error(transparent)]
    Failpoint(#[from] FailpointError),
    #[error("lease lost")]
    LeaseLost,
    /// The round the lane was part of failed (the cause is logged once for the round).
    #[error("its round failed")]
    Round,
}

impl From<StoreError> for LaneError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::LeaseLost { .. } => Self::LeaseLost,
            other => Self::Store(other),
        }
    }
}

/// What a successful round did.
#[derive(Debug, Default)]
pub(super) struct Round {
    /// Events published and marked.
    pub(super) published: usize,
    /// Lanes that returned a full batch: they may have more rows waiting.
    pub(super) full: Vec<u32>,
    /// Lanes whose lease turned out lost at marking: nothing of them was marked.
    pub(super) lost: Vec<u32>,
}

/// A failed round: the lanes it involved and why. Nothing of these lanes was marked.
#[derive(Debug)]
pub(super) struct RoundFailed {
    pub(super) lanes: Vec<u32>,
    pub(super) error: LaneError,
}

impl Relay {
    /// One round over `leases`: reads up to a batch of every lane, publishes everything read
    /// in one call, then marks it, each lane under its own lease.
    pub(super) async fn round(&self, leases: &[LaneLease]) -> Result<Round, RoundFailed> {
        let lanes: Vec<u32> = leases.iter().map(|l| l.lane).collect();
        let found = match self
            .ports
            .reader
            .pending_lanes(&lanes, self.config.batch_size)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                return Err(RoundFailed {
                    lanes,
                    error: e.into(),
                })
            }
        };
        if found.is_empty() {
            return Ok(Round::default());
        }
        let involved: Vec<u32> = found.iter().map(|f| f.lane).collect();
        let failed = |error: LaneError| RoundFailed {
            lanes: involved.clone(),
            error,
        };
        let batch: Vec<OutgoingMessage> = found
            .iter()
            .flat_map(|f| f.rows.iter().map(|r| self.message(r)))
            .collect();
        failpoint::hit(failpoint::RELAY_BEFORE_PUBLISH).map_err(|e| failed(e.into()))?;
        if let Err(e) = self.publisher.publish(&batch).await {
            bump(&self.stats.publish_errors, 1);
            return Err(failed(LaneError::Publish(e)));
        }
        // Confirmed by the transport; only now may the rows be marked.
        failpoint::hit(failpoint::RELAY_AFTER_PUBLISH).map_err(|e| failed(e.into()))?;
        let mut marks = Vec::with_capacity(found.len());
        for f in &found {
            // Every lane read was asked for, so its lease is among `leases`.
            if let Some(lease) = leases.iter().find(|l| l.lane == f.lane) {
                marks.push(LaneMark {
                    lease: lease.clone(),
                    ids: f.rows.iter().map(|r| r.id).collect(),
                });
            }
        }
        let lost = self
            .ports
            .reader
            .mark_published_lanes(&marks, self.clock.now_ms())
            .await
            .map_err(|e| failed(e.into()))?;
        let mut round = Round::default();
        for f in &found {
            if lost.contains(&f.lane) {
                continue;
            }
            round.published += f.rows.len();
            bump(&self.stats.published, f.rows.len() as u64);
            bump(&self.stats.batches, 1);
            if f.rows.len() >= self.config.batch_size {
                round.full.push(f.lane);
            }
        }
        round.lost = lost;
        Ok(round)
    }

    /// Publishes one lane's pending rows batch by batch until it is empty or its lease nears
    /// expiry.
    pub(super) async fn drain_lane(&self, lease: &LaneLease) -> Result<usize, LaneError> {
        let mut published = 0;
        loop {
            if self.clock.now_ms() >= lease.expires_at_ms {
                // Another instance may own the lane by now; publishing could reorder it.
                return Err(LaneError::LeaseLost);
            }
            let rows = self
                .ports
                .reader
                .pending(lease.lane, self.config.batch_size)
                .await?;
            if rows.is_empty() {
                return Ok(published);
            }
            let batch: Vec<OutgoingMessage> = rows.iter().map(|r| self.message(r)).collect();
            failpoint::hit(failpoint::RELAY_BEFORE_PUBLISH)?;
            if let Err(e) = self.publisher.publish(&batch).await {
                bump(&self.stats.publish_errors, 1);
                return Err(LaneError::Publish(e));
            }
            // Confirmed by the transport; only now may the rows be marked.
            failpoint::hit(failpoint::RELAY_AFTER_PUBLISH)?;
            let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
            self.ports
                .reader
                .mark_published(lease, &ids, self.clock.now_ms())
                .await?;
            bump(&self.stats.published, rows.len() as u64);
            bump(&self.stats.batches, 1);
            published += rows.len();
            if rows.len() < self.config.batch_size {
                return Ok(published);
            }
        }
    }

    fn message(&self, row: &OutboxRow) -> OutgoingMessage {
        OutgoingMessage {
            topic: self.config.routing.topic_for(&row.aggregate),
            key: Some(row.aggregate_id.clone()),
            headers: Headers::new()
                .with(TIPO, row.kind.clone())
                .with(ID_EVENTO, row.id.to_string()),
            payload: row.envelope_bytes(&self.config.source),
        }
    }
}
