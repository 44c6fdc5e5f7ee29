//! The same operator actions on a RabbitMQ dead-letter queue, where a dead letter is a
//! message in a queue rather than a record at an offset.
//!
//! A queue forgets what leaves it, so there are no marks: a replayed or discarded letter is
//! taken off the queue (acked) once its replay is confirmed, or at once for a discard, and
//! the audit entry, written in the service's database like the log's, keeps who did what to
//! which events. A letter is named `<dlq>/0/<position>`, its place from the head as `list`
//! read it: letters only leave through these actions, so a position stays valid until one
//! ahead of it is replayed or discarded (`--tipo`, `--motivo` and times select by content).
//! Replays go to the one group whose queue dead-lettered them, so there is no
//! `entrega-only-group` to set.

use std::sync::Arc;

use entrega_amqp::{Amqp, LetterSession, QueuedLetter};
use entrega_core::headers::REPLAYS;
use entrega_core::{
    Clock, DeadLetterId, DlqAction, DlqAuditEntry, DlqStore, Headers, Record, SystemClock,
};

use super::error::DlqError;
use super::filter::DlqFilter;
use super::letter::DeadLetter;
use super::replay::{
    audit_entry, confirmed_selection, ActionReport, Applied, DiscardOptions, HeldKeys,
    ReplayOptions,
};

/// Most letters one action reads off the queue.
const MAX_READ: usize = entrega_amqp::MAX_SESSION;

/// The dead-letter queue of one consumer group on one topic, and what operators do with it.
pub struct QueueDeadLetters {
    amqp: Amqp,
    group: String,
    topic: String,
    queue: String,
    store: Arc<dyn DlqStore>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for QueueDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueDeadLetters")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl QueueDeadLetters {
    /// Tends group `group`'s dead-letter queue on `topic`, keeping the audit in `store`.
    pub fn new(amqp: Amqp, group: &str, topic: &str, store: Arc<dyn DlqStore>) -> Self {
        let queue = amqp.group_queues(group, topic).dead_letter_queue();
        Self {
            amqp,
            group: group.to_owned(),
            topic: topic.to_owned(),
            queue,
            store,
            clock: Arc::new(SystemClock),
        }
    }

    /// Reads time from `clock` (audit entries).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The dead-letter queue tended.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The letters `filter` selects, head first (all of them are pending).
    pub async fn list(&self, filter: &DlqFilter) -> Result<Vec<DeadLetter>, DlqError> {
        let session = self.open(filter).await?;
        let letters = self.selected(&session, filter);
        session.close().await;
        Ok(letters.into_iter().map(|(_, l)| l).collect())
    }

    /// One letter, and the other letters of the same event (`id_evento`) in the queue.
    pub async fn show(&self, id: &DeadLetterId) -> Result<(DeadLetter, Vec<DeadLetter>), DlqError> {
        let all = self.list(&DlqFilter::all()).await?;
        let Some(letter) = all.iter().find(|l| l.id == *id).cloned() else {
            return Err(DlqError::UnknownId { id: id.clone() });
        };
        let history = all
            .into_iter()
            .filter(|l| l.event_id.is_some() && l.event_id == letter.event_id)
            .collect();
        Ok((letter, history))
    }

    /// Publishes the selected letters again to the group's queue (their key's shard), in
    /// queue order, each taken off the dead-letter queue only once its replay is confirmed.
    /// Refused, and left in the queue: a letter replayed `max_replays` times already, and
    /// every later one of its key. A replay that fails stops the action there; what was not
    /// replayed stays in the queue.
    pub async fn replay(
        &self,
        filter: &DlqFilter,
        options: &ReplayOptions,
    ) -> Result<ActionReport, DlqError> {
        if options.max_replays == 0 {
            return Err(DlqError::ZeroReplayLimit);
        }
        let mut session = self.open(filter).await?;
        let selected = self.selected(&session, filter);
        let selection = match confirmed_selection(
            selected.iter().map(|(_, l)| letter_name(l)),
            options.expect_matched,
            options.expect_selection.as_deref(),
        ) {
            Ok(selection) => selection,
            Err(e) => {
                session.close().await;
                return Err(e);
            }
        };
        let mut report = ActionReport {
            action: DlqAction::Replay,
            dry_run: options.dry_run,
            matched: selected.len(),
            selection,
            applied: Vec::new(),
            refused: Vec::new(),
        };
        let mut held = HeldKeys::default();
        let mut failure = None;
        for (raw, letter) in &selected {
            if let Some(refused) = held.refuse(letter, options.max_replays) {
                report.refused.push(refused);
                continue;
            }
            if !options.dry_run {
                let extra = Headers::new().with(REPLAYS, (letter.replays + 1).to_string());
                let replayed = session.replay(&self.group, &self.topic, raw, &extra).await;
                if let Err(e) = replayed.and(session.remove(raw.position).await) {
                    failure = Some(e);
                    break;
                }
            }
            report.applied.push(Applied {
                id: letter.id.to_string(),
                topic: self.topic.clone(),
                key: letter.key.clone(),
                replays: letter.replays + 1,
            });
        }
        session.close().await;
        let detail = format!(
            "max replays {}; to group {} only",
            options.max_replays, self.group
        );
        let entry = audit_entry(&report, filter, &options.operator, self.now(), Some(detail));
        self.store.record(&entry, &[]).await?;
        match failure {
            Some(e) => Err(DlqError::Transport(e)),
            None => Ok(report),
        }
    }

    /// Takes the selected letters off the queue for good, for `options.reason` (kept in the
    /// audit, with the events' ids).
    pub async fn discard(
        &self,
        filter: &DlqFilter,
        options: &DiscardOptions,
    ) -> Result<ActionReport, DlqError> {
        let reason = options.checked_reason()?;
        let mut session = self.open(filter).await?;
        let selected = self.selected(&session, filter);
        let selection = match confirmed_selection(
            selected.iter().map(|(_, l)| letter_name(l)),
            options.expect_matched,
            options.expect_selection.as_deref(),
        ) {
            Ok(selection) => selection,
            Err(e) => {
                session.close().await;
                return Err(e);
            }
        };
        let mut report = ActionReport {
            action: DlqAction::Discard,
            dry_run: options.dry_run,
            matched: selected.len(),
            selection,
            applied: Vec::new(),
            refused: Vec::new(),
        };
        let mut events = Vec::new();
        let mut failure = None;
        for (raw, letter) in &selected {
            if !options.dry_run {
                if let Err(e) = session.remove(raw.position).await {
                    failure = Some(e);
                    break;
                }
            }
            events.push(
                letter
                    .event_id
                    .clone()
                    .unwrap_or_else(|| letter.id.to_string()),
            );
            report.applied.push(Applied {
                id: letter.id.to_string(),
                topic: self.queue.clone(),
                key: letter.key.clone(),
                replays: 0,
            });
        }
        session.close().await;
        let detail = format!("{reason}; events {}", events.join(" "));
        let entry = audit_entry(&report, filter, &options.operator, self.now(), Some(detail));
        self.store.record(&entry, &[]).await?;
        match failure {
            Some(e) => Err(DlqError::Transport(e)),
            None => Ok(report),
        }
    }

    /// The latest `limit` operator actions, newest first.
    pub async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, DlqError> {
        Ok(self.store.audit(limit).await?)
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    async fn open(&self, filter: &DlqFilter) -> Result<LetterSession, DlqError> {
        filter.validate()?;
        if let Some(topic) = filter.topic.as_ref().filter(|t| **t != self.queue) {
            return Err(DlqError::NotTended {
                topic: topic.clone(),
                tended: self.queue.clone(),
            });
        }
        if let Some(id) = filter.ids.iter().find(|id| id.topic != self.queue) {
            return Err(DlqError::NotADeadLetterTopic {
                id: id.clone(),
                topics: self.queue.clone(),
            });
        }
        let session = self.amqp.open_letters(&self.queue, MAX_READ).await?;
        let letters = session.letters();
        let missing = filter.ids.iter().find(|id| {
            !letters.iter().any(|l| {
                i64::try_from(l.position).is_ok_and(|p| p == id.offset) && id.partition == 0
            })
        });
        if let Some(id) = missing {
            let id = id.clone();
            session.close().await;
            return Err(DlqError::UnknownId { id });
        }
        Ok(session)
    }

    /// The session's letters `filter` selects, each with its operator view; an id that names
    /// no letter is an error only for the actions, which check [`DlqFilter::ids`] themselves.
    fn selected(
        &self,
        session: &LetterSession,
        filter: &DlqFilter,
    ) -> Vec<(QueuedLetter, DeadLetter)> {
        session
            .letters()
            .into_iter()
            .map(|raw| (raw.clone(), self.letter(raw)))
            .filter(|(_, letter)| filter.matches(letter))
            .collect()
    }

    fn letter(&self, raw: &QueuedLetter) -> DeadLetter {
        DeadLetter::from_record(Record {
            topic: self.queue.clone(),
            partition: 0,
            offset: i64::try_from(raw.position).unwrap_or(i64::MAX),
            key: raw.key.clone(),
            headers: raw.headers.clone(),
            payload: raw.payload.clone(),
            timestamp_ms: raw.timestamp_ms.unwrap_or(0),
        })
    }
}

/// What names a queued letter in a selection: its event's id, else its place in the queue.
fn letter_name(letter: &DeadLetter) -> String {
    letter
        .event_id
        .clone()
        .unwrap_or_else(|| letter.id.to_string())
}
