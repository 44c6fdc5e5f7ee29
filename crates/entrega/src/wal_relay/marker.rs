//! Marking published rows in bulk and confirming positions, in the order the batches were
//! published: a position is confirmed only once every row before it is marked.

use std::time::Duration;

use entrega_postgres::PgPool;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::failpoint;
use crate::relay_config::{bump, RelayStats};

/// Rows the broker confirmed, and the stream position that is whole once they are marked.
#[derive(Debug, Default)]
pub(super) struct Confirmed {
    /// The rows' ids.
    pub(super) ids: Vec<Uuid>,
    /// The end of the last transaction every row of which is in this batch or an earlier one
    /// (or a heartbeat's position); `None` inside a transaction.
    pub(super) upto: Option<u64>,
}

/// The marker's side of the relay: what to mark, and where the marked position is reported.
pub(super) struct Marker {
    pub(super) pool: PgPool,
    pub(super) stats: std::sync::Arc<RelayStats>,
    pub(super) backoff: Backoff,
    pub(super) jobs: mpsc::Receiver<Confirmed>,
    pub(super) marked: watch::Sender<u64>,
    /// Shortest time between two marks.
    pub(super) every: Duration,
}

/// Why the marker stopped before its queue ended.
#[derive(Debug)]
pub(super) struct MarkFailed(pub(super) entrega_core::StoreError);

impl Marker {
    /// Marks the arriving batches, those that arrive within `every` of the last mark merged
    /// into one statement, then reports the position it completed. Transient failures are retried with backoff; the queue
    /// ending ends the marker once everything in it was marked.
    pub(super) async fn run(mut self) -> Result<(), MarkFailed> {
        let mut marked_at: Option<tokio::time::Instant> = None;
        while let Some(first) = self.jobs.recv().await {
            let mut ids = first.ids;
            let mut upto = first.upto;
            // One statement (and one commit) per `every` at most: what arrives meanwhile joins
            // it. Confirmations wait as long; publishing does not.
            if let Some(at) = marked_at {
                let until = at + self.every;
                loop {
                    tokio::select! {
                        more = self.jobs.recv() => match more {
                            Some(more) => {
                                ids.extend(more.ids);
                                upto = more.upto.or(upto);
                            }
                            None => break,
                        },
                        () = tokio::time::sleep_until(until) => break,
                    }
                }
            }
            while let Ok(more) = self.jobs.try_recv() {
                ids.extend(more.ids);
                upto = more.upto.or(upto);
            }
            marked_at = Some(tokio::time::Instant::now());
            if !ids.is_empty() {
                self.mark(&ids).await?;
                bump(&self.stats.published, ids.len() as u64);
                bump(&self.stats.batches, 1);
                failpoint::hit(failpoint::WAL_AFTER_MARK).map_err(|e| {
                    MarkFailed(entrega_core::StoreError::unavailable(e.to_string()))
                })?;
            }
            if let Some(upto) = upto {
                self.marked.send_replace(upto);
            }
        }
        Ok(())
    }

    /// Marks `ids`. The stream can carry a transaction before its commit is visible to other
    /// sessions (the walsender decodes the commit record; the transaction becomes visible a
    /// moment later), so a row the statement did not find and that is not marked already is
    /// looked for again, briefly, until it is visible. One still not visible after
    /// [`VISIBLE_WITHIN`] fails the mark, so its position is never confirmed.
    async fn mark(&self, ids: &[Uuid]) -> Result<(), MarkFailed> {
        let mut waiting: Vec<Uuid> = ids.to_vec();
        let started = std::time::Instant::now();
        let mut failures = 0u32;
        let mut pause = Duration::from_micros(200);
        loop {
            match self.mark_visible(&waiting).await {
                Ok(left) if left.is_empty() => return Ok(()),
                Ok(left) => {
                    if started.elapsed() > VISIBLE_WITHIN {
                        // Their position is not confirmed: the session ends, and the next one
                        // reads, publishes and marks them again.
                        let first = left.first().map(Uuid::to_string).unwrap_or_default();
                        return Err(MarkFailed(entrega_core::StoreError::unavailable(format!(
                            "{} published outbox rows (the first {first}) not visible to mark \
                             after {VISIBLE_WITHIN:?}",
                            left.len()
                        ))));
                    }
                    waiting = left;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                // A few quick tries; then the session ends (releasing the slot, see
                // `session`) and the rows are published and marked again by the next one.
                Err(e) if e.is_transient() && failures < MARK_TRIES => {
                    failures = failures.saturating_add(1);
                    let delay: Duration = self.backoff.delay(failures);
                    tracing::warn!(rows = waiting.len(), failures, ?delay, error = %e, "marking published outbox rows failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(MarkFailed(e)),
            }
        }
    }

    /// Marks what of `ids` is visible and unmarked; returns the ids neither marked now nor
    /// marked before (not visible yet).
    async fn mark_visible(&self, ids: &[Uuid]) -> Result<Vec<Uuid>, entrega_core::StoreError> {
        let marked: Vec<Uuid> = sqlx::query_scalar(
            "UPDATE outbox SET publicado_en = now() \
             WHERE id = ANY($1) AND publicado_en IS NULL RETURNING id",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(entrega_postgres::classify)?;
        if marked.len() == ids.len() {
            return Ok(Vec::new());
        }
        let marked: std::collections::HashSet<Uuid> = marked.into_iter().collect();
        let rest: Vec<Uuid> = ids
            .iter()
            .filter(|id| !marked.contains(id))
            .copied()
            .collect();
        // Published again after a restart: marked by the session before.
        let before: std::collections::HashSet<Uuid> = sqlx::query_scalar(
            "SELECT id FROM outbox WHERE id = ANY($1) AND publicado_en IS NOT NULL",
        )
        .bind(&rest)
        .fetch_all(&self.pool)
        .await
        .map_err(entrega_postgres::classify)?
        .into_iter()
        .collect();
        Ok(rest.into_iter().filter(|id| !before.contains(id)).collect())
    }
}

/// Attempts at a mark that fails transiently before the session gives up.
const MARK_TRIES: u32 = 3;

/// How long a published row may stay invisible before the mark fails.
const VISIBLE_WITHIN: Duration = Duration::from_secs(30);
