//! Dead-letter tooling for operators: list, inspect, count, replay and discard the records
//! the worker set aside in `<topic>.dlq` (ADR 0008).
//!
//! Dead letters are read through [`LogInspector`] (the log transport in a database and
//! Kafka alike) and replayed through [`Publisher`]. What operators did is kept by a
//! [`DlqStore`] in the database of the service that owns the dead-letter topic: a mark per
//! dead letter replayed or discarded, and an audit entry per action, dry runs included.
//! Pending dead letters are those without a mark.
//!
//! ```no_run
//! use entrega::dlq::{DeadLetters, DlqFilter, ReplayOptions};
//!
//! # async fn tend(db: entrega::Db, broker: entrega::Broker) -> Result<(), entrega::dlq::DlqError> {
//! let tool = DeadLetters::new(broker.inspector(), broker.publisher(), db.dead_letters(),
//!                             vec!["pedidos.eventos.dlq".into()]);
//! let about_products = DlqFilter::all().with_reason("producto");
//! let pending = tool.list(&about_products, false).await?;
//! let report = tool.replay(&about_products, &ReplayOptions::new("ana")).await?;
//! # let _ = (pending, report); Ok(()) }
//! ```

mod acting;
mod compose;
mod error;
mod filter;
mod held;
mod letter;
#[cfg(feature = "amqp")]
mod queue;
mod release;
mod replay;
mod stats;

use std::collections::HashMap;
use std::sync::Arc;

use entrega_core::{
    Clock, DeadLetterId, DeadLetterMark, DlqAuditEntry, DlqStore, LogInspector, Publisher,
    ReplayKey, SystemClock,
};

pub use acting::{ACTION_LEASE, WAIT_FOR_ACTION};
pub(crate) use compose::truncate;
pub use compose::{dead_letter_of, set_origin, MAX_REASON_BYTES, ORIGIN_HEADERS};
pub use error::DlqError;
pub use filter::DlqFilter;
pub use held::{send_held, DbHeldLetters, SentHeld};
pub use letter::{reason_class, DeadLetter, Origin};
#[cfg(feature = "amqp")]
pub use queue::QueueDeadLetters;
pub use release::release_outbox_row;
pub use replay::{
    selection_token, ActionReport, Applied, DiscardOptions, Refused, ReplayOptions,
    DEFAULT_MAX_REPLAYS,
};
pub use stats::{Counts, DlqStats, ReasonCount, RetryDepth, TopicStats};

/// Records read from a partition per call.
const READ_CHUNK: usize = 500;

/// The dead letters of some dead-letter topics, and what operators do with them.
pub struct DeadLetters {
    inspector: Arc<dyn LogInspector>,
    publisher: Arc<dyn Publisher>,
    store: Arc<dyn DlqStore>,
    clock: Arc<dyn Clock>,
    topics: Vec<String>,
    replay_key: Option<ReplayKey>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters")
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl DeadLetters {
    /// Tends the dead-letter topics `topics` (`<topic>.dlq`), reading through `inspector`,
    /// replaying through `publisher`, keeping state in `store`.
    pub fn new(
        inspector: Arc<dyn LogInspector>,
        publisher: Arc<dyn Publisher>,
        store: Arc<dyn DlqStore>,
        topics: Vec<String>,
    ) -> Self {
        Self {
            inspector,
            publisher,
            store,
            clock: Arc::new(SystemClock),
            topics,
            replay_key: None,
        }
    }

    /// Signs replays to one group ([`ReplayOptions::group`]) with `key`, the key the
    /// consumers verify `entrega-only-group` with. Without it such a replay is refused.
    pub fn with_replay_key(mut self, key: ReplayKey) -> Self {
        self.replay_key = Some(key);
        self
    }

    /// Reads time from `clock` (marks and audit entries).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The dead-letter topics tended.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// The dead letters `filter` selects, pending only unless `include_done`, in topic,
    /// partition and offset order.
    pub async fn list(
        &self,
        filter: &DlqFilter,
        include_done: bool,
    ) -> Result<Vec<DeadLetter>, DlqError> {
        let letters = self.read(filter).await?;
        Ok(letters
            .into_iter()
            .filter(|l| include_done || l.is_pending())
            .collect())
    }

    /// One dead letter, whatever its state, and every dead letter of the same event
    /// (`id_evento`) on its topic: its history of failing, being replayed and failing again.
    pub async fn show(&self, id: &DeadLetterId) -> Result<(DeadLetter, Vec<DeadLetter>), DlqError> {
        let topic_filter = DlqFilter::all().with_topic(id.topic.clone());
        let mut letters = self.read(&DlqFilter::id(id.clone())).await?;
        let Some(letter) = letters.pop() else {
            return Err(DlqError::UnknownId { id: id.clone() });
        };
        let history = match &letter.event_id {
            Some(event) => self
                .read(&topic_filter)
                .await?
                .into_iter()
                .filter(|l| l.event_id.as_ref() == Some(event))
                .collect(),
            None => vec![letter.clone()],
        };
        Ok((letter, history))
    }

    /// The latest `limit` operator actions, newest first.
    pub async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, DlqError> {
        Ok(self.store.audit(limit).await?)
    }

    /// Every dead letter `filter` selects, with its mark; validates the filter and that each
    /// id names a record of a tended topic.
    async fn read(&self, filter: &DlqFilter) -> Result<Vec<DeadLetter>, DlqError> {
        filter.validate()?;
        let topics = self.topics_of(filter)?;
        let mut out = Vec::new();
        for topic in &topics {
            let marks: HashMap<DeadLetterId, DeadLetterMark> = self
                .store
                .marks(topic)
                .await?
                .into_iter()
                .map(|m| (m.id.clone(), m))
                .collect();
            let wanted: Vec<&DeadLetterId> =
                filter.ids.iter().filter(|id| id.topic == *topic).collect();
            let records = if wanted.is_empty() {
                self.read_topic(topic).await?
            } else {
                self.read_ids(&wanted).await?
            };
            for record in records {
                let mut letter = DeadLetter::from_record(record);
                if filter.matches(&letter) {
                    letter.mark = marks.get(&letter.id).cloned();
                    out.push(letter);
                }
            }
        }
        Ok(out)
    }

    /// The topics `filter` reads: those of its ids, its topic, or every tended topic.
    fn topics_of(&self, filter: &DlqFilter) -> Result<Vec<String>, DlqError> {
        let tended = |topic: &str| self.topics.iter().any(|t| t == topic);
        if !filter.ids.is_empty() {
            let mut topics: Vec<String> = Vec::new();
            for id in &filter.ids {
                if !tended(&id.topic) {
                    return Err(DlqError::NotADeadLetterTopic {
                        id: id.clone(),
                        topics: self.topics.join(", "),
                    });
                }
                if !topics.contains(&id.topic) {
                    topics.push(id.topic.clone());
                }
            }
            return Ok(topics);
        }
        match &filter.topic {
            Some(topic) if !tended(topic) => Err(DlqError::ConflictingFilters {
                reason: format!(
                    "--topic {topic} is not a tended dead-letter topic (expected one of: {})",
                    self.topics.join(", ")
                ),
            }),
            Some(topic) => Ok(vec![topic.clone()]),
            None => Ok(self.topics.clone()),
        }
    }

    /// Every record of `topic`, partition by partition, in offset order.
    async fn read_topic(&self, topic: &str) -> Result<Vec<entrega_core::Record>, DlqError> {
        let mut out = Vec::new();
        for (partition, end) in self.inspector.end_offsets(topic).await? {
            let mut from = 0;
            while from < end {
                let chunk = self
                    .inspector
                    .read(topic, partition, from, READ_CHUNK)
                    .await?;
                let Some(last) = chunk.last() else { break };
                from = last.offset + 1;
                out.extend(chunk);
            }
        }
        Ok(out)
    }

    /// The records the ids name; an id naming no record is an error.
    async fn read_ids(&self, ids: &[&DeadLetterId]) -> Result<Vec<entrega_core::Record>, DlqError> {
        let mut out = Vec::new();
        for id in ids {
            let ends = self.inspector.end_offsets(&id.topic).await?;
            let inside = ends
                .iter()
                .any(|(p, end)| *p == id.partition && id.offset < *end);
            if !inside {
                return Err(DlqError::UnknownId { id: (*id).clone() });
            }
            let found = self
                .inspector
                .read(&id.topic, id.partition, id.offset, 1)
                .await?
                .into_iter()
                .find(|r| r.offset == id.offset);
            match found {
                Some(record) => out.push(record),
                None => return Err(DlqError::UnknownId { id: (*id).clone() }),
            }
        }
        out.sort_by_key(|r| (r.partition, r.offset));
        out.dedup_by_key(|r| (r.partition, r.offset));
        Ok(out)
    }
}
