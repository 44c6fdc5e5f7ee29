//! Draining one lane alone, batch by batch, while it recovers from a failure (the held lanes
//! go together in rounds, see `rounds`), and what both share: the message a row becomes and
//! why a lane failed.

use entrega_core::{LaneLease, LaneRows, OutboxRow, OutgoingMessage, StoreError, TransportError};

use super::{wire, Relay};
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

impl Relay {
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
            let refs: Vec<&OutboxRow> = rows.iter().collect();
            match self.publish(&refs).await {
                Ok(()) => {}
                Err(LaneError::Publish(e)) if !e.is_transient() => {
                    // Refused for good: the refused rows get their refusal recorded, the
                    // others go out; the lane is read again on the next pass.
                    tracing::warn!(lane = lease.lane, error = %e, "relay batch refused");
                    let read = [LaneRows {
                        lane: lease.lane,
                        rows,
                    }];
                    let mut narrowed = self.isolate(std::slice::from_ref(lease), &read).await;
                    return match narrowed.failed.pop() {
                        Some((_, error)) => Err(error),
                        None => Ok(published + narrowed.published),
                    };
                }
                Err(e) => return Err(e),
            }
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

    /// Publishes `rows` in one call, through the relay's failpoints; `Ok` only once the
    /// transport confirmed all of them.
    pub(super) async fn publish(&self, rows: &[&OutboxRow]) -> Result<(), LaneError> {
        let mut batch = Vec::with_capacity(rows.len());
        for row in rows {
            self.messages(row, &mut batch).map_err(LaneError::Publish)?;
        }
        failpoint::hit(failpoint::RELAY_BEFORE_PUBLISH)?;
        let started = std::time::Instant::now();
        let published = self.publisher.publish(&batch).await;
        metrics::histogram!(crate::metrics::RELAY_PUBLISH_SECONDS)
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = published {
            bump(&self.stats.publish_errors, 1);
            return Err(LaneError::Publish(e));
        }
        // Confirmed by the transport; only now may the rows be marked.
        failpoint::hit(failpoint::RELAY_AFTER_PUBLISH)?;
        Ok(())
    }

    /// The messages of `row` onto `batch` ([`wire::messages`]).
    pub(super) fn messages(
        &self,
        row: &OutboxRow,
        batch: &mut Vec<OutgoingMessage>,
    ) -> Result<(), TransportError> {
        wire::messages(&self.config, row, batch)
    }
}
