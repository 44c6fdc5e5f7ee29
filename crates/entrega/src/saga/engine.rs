//! The orchestrator: every change of a saga (its row, its history, the commands it sends
//! through the outbox, and the inbox key of the reply that caused it) is one transaction.

use std::sync::Arc;

use entrega_core::{Clock, Envelope, NewEvent, StoreError, TRACEPARENT};
use serde_json::Value;

use super::error::SagaError;
use super::flow::{Ending, Reply, SagaFlow};
use super::machine::{self, Effect, Input, Transition};
use super::record::{EventKind, HistoryEntry, Phase, SagaRecord, SagaStatus};
use super::stats::SagaStats;
use super::store::{self, Lock};
use crate::db::{Db, Tx};

/// What [`Sagas::start_in`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// The saga was created and its first command enqueued.
    New,
    /// A saga with that id exists already: nothing was written.
    Existing,
}

/// What a reply did to its saga.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// The saga moved on.
    Applied,
    /// Its event had been applied before (its inbox key was recorded).
    Duplicate,
    /// Late, repeated or under another key: recorded in the history, nothing else changed.
    Ignored(&'static str),
    /// The event is not a reply of this saga type.
    NotOurs,
    /// No saga has the id the reply names.
    UnknownSaga(String),
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The saga was running: it now compensates.
    Cancelling,
    /// It already compensates, or has compensated, or waits for an operator to finish
    /// compensating: nothing changed.
    AlreadyCancelled,
    /// It completed: too late to cancel, nothing changed.
    Completed,
    /// The step in flight has no compensation: its effect could not be undone, so the saga
    /// goes forward and nothing changed (its point of no return).
    PastPointOfNoReturn,
}

/// What a written transition leaves to count once its transaction commits.
#[derive(Debug)]
pub(crate) struct Written {
    kind: String,
    id: String,
    ending: Option<Ending>,
    /// Why, when the saga now waits for an operator.
    needs_operator: Option<String>,
}

/// The sagas of one [`SagaFlow`] in one database.
#[derive(Clone)]
pub struct Sagas {
    db: Db,
    flow: Arc<dyn SagaFlow>,
    clock: Arc<dyn Clock>,
    consumer: String,
    stats: Arc<SagaStats>,
}

impl std::fmt::Debug for Sagas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sagas")
            .field("kind", &self.flow.kind())
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl Sagas {
    /// The sagas of `flow` in `db` (migrated with
    /// [`MigrationSet::Sagas`](entrega_core::MigrationSet), `Outbox`, `Inbox` and `Rpc`). Replies are
    /// claimed in `mensajes_procesados` as consumer `saga.<kind>`.
    pub fn new(db: Db, flow: Arc<dyn SagaFlow>, clock: Arc<dyn Clock>) -> Self {
        let consumer = format!("saga.{}", flow.kind());
        Self {
            db,
            flow,
            clock,
            consumer,
            stats: Arc::new(SagaStats::default()),
        }
    }

    /// The name of step `index` of the flow, if it has one.
    pub fn step_name(&self, index: usize) -> Option<&'static str> {
        self.flow.steps().get(index).map(|s| s.name)
    }

    /// The saga type.
    pub fn kind(&self) -> &str {
        self.flow.kind()
    }

    /// Now, by the orchestrator's clock (epoch ms).
    pub(crate) fn clock_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The flow.
    pub(crate) fn flow(&self) -> &dyn SagaFlow {
        self.flow.as_ref()
    }

    /// Who claims replies in `mensajes_procesados` (`saga.<kind>`).
    pub(crate) fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Counts a reply seen before.
    pub(crate) fn stats_duplicate(&self) {
        self.stats.duplicate();
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// What the sagas have done since this value was made (shared by its clones).
    pub fn stats(&self) -> Arc<SagaStats> {
        Arc::clone(&self.stats)
    }

    /// Starts saga `id` with `input` in the caller's transaction (the order and its saga
    /// are written together): its row, its history and its first command. Starting an id
    /// that exists writes nothing.
    pub async fn start_in(
        &self,
        tx: &mut Tx,
        id: &str,
        input: Value,
    ) -> Result<Started, SagaError> {
        let now = self.clock.now_ms();
        let record = SagaRecord::new(self.flow.kind(), id, input, now);
        let t = machine::apply(self.flow.steps(), record, Input::Start, now);
        if !store::insert(tx, &t.record).await? {
            return Ok(Started::Existing);
        }
        // The caller commits: counted now.
        let written = self.write(tx, t, None).await?;
        self.count(&written);
        self.stats.started();
        Ok(Started::New)
    }

    /// Applies a reply event: its inbox key claimed, the saga moved, the next command
    /// enqueued, all in one transaction. An unreadable reply is a permanent error.
    pub async fn handle(&self, envelope: &Envelope) -> Result<ReplyOutcome, SagaError> {
        let reply = match self.flow.reply(envelope) {
            Ok(Some(reply)) => reply,
            Ok(None) => return Ok(ReplyOutcome::NotOurs),
            Err(e) => return Err(SagaError::BadReply(e)),
        };
        let mut tx = self.db.begin().await?;
        if !tx
            .claim(&self.consumer, &envelope.id.hyphenated().to_string())
            .await?
        {
            tx.rollback().await?;
            self.stats.duplicate();
            return Ok(ReplyOutcome::Duplicate);
        }
        let (outcome, written) = self.apply_reply(&mut tx, &reply).await?;
        tx.commit().await?;
        self.count_reply(&outcome, written.as_ref());
        if outcome == ReplyOutcome::Applied {
            crate::failpoint::hit(crate::failpoint::SAGA_AFTER_COMMIT)
                .map_err(StoreError::unavailable)?;
        }
        Ok(outcome)
    }

    /// Applies `reply` to its saga in `tx`: what it did, and what to count once `tx` commits.
    pub(crate) async fn apply_reply(
        &self,
        tx: &mut Tx,
        reply: &Reply,
    ) -> Result<(ReplyOutcome, Option<Written>), SagaError> {
        let kind = self.flow.kind();
        let Some(record) = store::load(tx, kind, &reply.saga_id, Lock::Wait).await? else {
            return Ok((ReplyOutcome::UnknownSaga(reply.saga_id.clone()), None));
        };
        let version = record.version;
        let t = machine::apply(
            self.flow.steps(),
            record,
            Input::Reply(reply),
            self.clock.now_ms(),
        );
        let effect = t.effect;
        let written = self.write(tx, t, Some(version)).await?;
        let outcome = match effect {
            Effect::Ignored(why) => ReplyOutcome::Ignored(why),
            Effect::Changed | Effect::Refused => ReplyOutcome::Applied,
        };
        Ok((outcome, Some(written)))
    }

    /// Counts a reply whose transaction committed.
    pub(crate) fn count_reply(&self, outcome: &ReplyOutcome, written: Option<&Written>) {
        if let ReplyOutcome::Ignored(_) = outcome {
            self.stats.ignored();
        }
        if let Some(written) = written {
            self.count(written);
        }
    }

    /// Cancels saga `id` for `reason` in its own transaction (see [`Sagas::cancel_in`]).
    pub async fn cancel(&self, id: &str, reason: &str) -> Result<CancelOutcome, SagaError> {
        let mut tx = self.db.begin().await?;
        let (outcome, written) = self.cancel_written(&mut tx, id, reason).await?;
        tx.commit().await?;
        if let Some(written) = written {
            self.count(&written);
        }
        Ok(outcome)
    }

    /// Cancels saga `id` in the caller's transaction: a running saga compensates every step
    /// that may have taken effect, the one in flight included; a completed one, or one whose
    /// step in flight has no compensation, is not touched. Either outcome, never both.
    pub async fn cancel_in(
        &self,
        tx: &mut Tx,
        id: &str,
        reason: &str,
    ) -> Result<CancelOutcome, SagaError> {
        // The caller commits: counted now.
        let (outcome, written) = self.cancel_written(tx, id, reason).await?;
        if let Some(written) = written {
            self.count(&written);
        }
        Ok(outcome)
    }

    async fn cancel_written(
        &self,
        tx: &mut Tx,
        id: &str,
        reason: &str,
    ) -> Result<(CancelOutcome, Option<Written>), SagaError> {
        let kind = self.flow.kind();
        let record = store::load(tx, kind, id, Lock::Wait)
            .await?
            .ok_or_else(|| SagaError::NotFound {
                kind: kind.to_owned(),
                id: id.to_owned(),
            })?;
        let status = record.status;
        let version = record.version;
        let t = machine::apply(
            self.flow.steps(),
            record,
            Input::Cancel { reason },
            self.clock.now_ms(),
        );
        if t.effect == Effect::Refused {
            let outcome = match status {
                SagaStatus::Completed => CancelOutcome::Completed,
                SagaStatus::Running => CancelOutcome::PastPointOfNoReturn,
                _ => CancelOutcome::AlreadyCancelled,
            };
            return Ok((outcome, None));
        }
        let written = self.write(tx, t, Some(version)).await?;
        Ok((CancelOutcome::Cancelling, Some(written)))
    }

    /// Sends again the compensation a saga waits on for an operator, with its attempts
    /// counted from 1, and records who asked in the history.
    pub async fn retry(&self, id: &str, operator: &str) -> Result<(), SagaError> {
        let kind = self.flow.kind();
        let mut tx = self.db.begin().await?;
        let record = store::load(&mut tx, kind, id, Lock::Wait)
            .await?
            .ok_or_else(|| SagaError::NotFound {
                kind: kind.to_owned(),
                id: id.to_owned(),
            })?;
        let (status, version) = (record.status, record.version);
        let t = machine::apply(
            self.flow.steps(),
            record,
            Input::OperatorRetry { operator },
            self.clock.now_ms(),
        );
        if t.effect == Effect::Refused {
            tx.rollback().await?;
            return Err(SagaError::NotWaiting {
                id: id.to_owned(),
                status,
            });
        }
        let written = self.write(&mut tx, t, Some(version)).await?;
        tx.commit().await?;
        self.count(&written);
        Ok(())
    }

    /// Fires the timers due now (resends, deadlines, compensations unanswered), at most
    /// `limit` sagas, each in its own transaction; returns how many moved. A saga another
    /// orchestrator holds is left to it.
    pub async fn tick(&self, limit: usize) -> Result<usize, SagaError> {
        let kind = self.flow.kind();
        let now = self.clock.now_ms();
        let ids = store::due(
            &self.db,
            kind,
            now,
            i64::try_from(limit).unwrap_or(i64::MAX),
        )
        .await?;
        let mut moved = 0;
        for id in ids {
            let mut tx = self.db.begin().await?;
            let Some(record) = store::load(&mut tx, kind, &id, Lock::Skip).await? else {
                tx.rollback().await?;
                continue;
            };
            let version = record.version;
            let t = machine::apply(self.flow.steps(), record, Input::Due, self.clock.now_ms());
            if t.effect != Effect::Changed {
                tx.rollback().await?;
                continue;
            }
            let written = self.write(&mut tx, t, Some(version)).await?;
            tx.commit().await?;
            self.count(&written);
            moved += 1;
        }
        Ok(moved)
    }

    /// When the soonest timer fires, epoch ms, if any is set.
    pub async fn next_due(&self) -> Result<Option<i64>, SagaError> {
        Ok(store::next_due(&self.db, self.flow.kind()).await?)
    }

    /// Writes a transition: commands to the outbox, the row over `read` (a new row when
    /// `None`, inserted by the caller), the history, and the flow's ending. What it returns
    /// is counted ([`Sagas::count`]) once the transaction commits.
    async fn write(
        &self,
        tx: &mut Tx,
        mut t: Transition,
        read: Option<i64>,
    ) -> Result<Written, SagaError> {
        for send in &t.sends {
            let event = match send.phase {
                Phase::Action => self.flow.command(&t.record, send.step, &send.key),
                Phase::Compensation => self.flow.compensation(&t.record, send.step, &send.key),
            }
            .map_err(SagaError::Flow)?;
            tx.enqueue(&continuing(event, &t.record)).await?;
        }
        if let Some(version) = read {
            t.record.updated_ms = self.clock.now_ms();
            if !store::update(tx, &t.record, version).await? {
                return Err(SagaError::Conflict {
                    id: t.record.id.clone(),
                    version,
                });
            }
            t.record.version = version.saturating_add(1);
        }
        store::append(tx, &t.record.kind, &t.record.id, &t.history).await?;
        if let Some(ending) = &t.ending {
            self.flow.finished(tx, &t.record, ending).await?;
        }
        let needs_operator = t.history.iter().any(|e| e.what == EventKind::NeedsOperator);
        Ok(Written {
            needs_operator: needs_operator.then(|| t.record.reason.clone().unwrap_or_default()),
            ending: t.ending,
            kind: t.record.kind,
            id: t.record.id,
        })
    }

    /// Counts a transition whose transaction committed (or will, in the caller's hands).
    pub(crate) fn count(&self, written: &Written) {
        if let Some(ending) = &written.ending {
            self.stats.ended(ending, &written.kind, &written.id);
        }
        if let Some(reason) = &written.needs_operator {
            tracing::warn!(
                saga = %written.id,
                kind = %written.kind,
                %reason,
                "a saga waits for an operator"
            );
            self.stats.needs_operator();
        }
    }

    /// Sagas newest first, in `status` if given, at most `limit`.
    pub async fn list(
        &self,
        status: Option<SagaStatus>,
        limit: usize,
    ) -> Result<Vec<SagaRecord>, SagaError> {
        self.list_page(status, 0, limit).await
    }

    /// Like [`Sagas::list`], skipping the `offset` newest first: one page of a longer list.
    pub async fn list_page(
        &self,
        status: Option<SagaStatus>,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<SagaRecord>, SagaError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        Ok(store::list(&self.db, self.flow.kind(), status, offset, limit).await?)
    }

    /// Saga `id` and its history, oldest entry first.
    pub async fn show(
        &self,
        id: &str,
    ) -> Result<Option<(SagaRecord, Vec<HistoryEntry>)>, SagaError> {
        let kind = self.flow.kind();
        let Some(record) = store::get(&self.db, kind, id).await? else {
            return Ok(None);
        };
        let history = store::history(&self.db, kind, id).await?;
        Ok(Some((record, history)))
    }

    /// How many sagas are in each status (those with none left out).
    pub async fn counts(&self) -> Result<Vec<(SagaStatus, i64)>, SagaError> {
        Ok(store::counts(&self.db, self.flow.kind()).await?)
    }
}

/// `event` carrying the saga's own trace when it is sent outside any traced work (a timer's
/// resend or deadline); inside traced work (a reply being handled), [`Tx::enqueue`] gives it
/// that work's context, which continues the same trace.
fn continuing(event: NewEvent, record: &SagaRecord) -> NewEvent {
    match (&record.trace, crate::trace::current()) {
        (Some(trace), None) if event.headers.get(TRACEPARENT).is_none() => {
            event.with_header(TRACEPARENT, trace.clone())
        }
        _ => event,
    }
}
