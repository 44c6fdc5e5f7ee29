//! The seam of dead-letter tooling: what operators did to dead letters, kept in the database
//! of the service whose dead-letter topic it is.
//!
//! Dead letters themselves stay where the worker put them, in `<topic>.dlq`, and are read
//! through [`crate::LogInspector`]; a dead letter is named by its place there
//! ([`DeadLetterId`]). What an operator did to one (replayed it, discarded it) is a
//! [`DeadLetterMark`]; every action (including dry runs) is a [`DlqAuditEntry`]. Both go
//! through [`DlqStore`].

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;

use crate::StoreError;

/// Where a dead letter sits: `<dlq-topic>/<partition>/<offset>`, e.g.
/// `pedidos.eventos.dlq/0/17`. Topic names never hold `/` (Kafka allows only
/// `[a-zA-Z0-9._-]`), so the text form is unambiguous and safe to copy into a shell.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadLetterId {
    /// The dead-letter topic.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: i64,
}

impl DeadLetterId {
    /// The id of the record at `topic`/`partition`/`offset`.
    pub fn new(topic: impl Into<String>, partition: u32, offset: i64) -> Self {
        Self {
            topic: topic.into(),
            partition,
            offset,
        }
    }
}

impl fmt::Display for DeadLetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// Text that is not a [`DeadLetterId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid dead-letter id `{text}`: expected <dlq-topic>/<partition>/<offset>, e.g. pedidos.eventos.dlq/0/17")]
pub struct InvalidDeadLetterId {
    /// The text given.
    pub text: String,
}

impl FromStr for DeadLetterId {
    type Err = InvalidDeadLetterId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidDeadLetterId {
            text: text.to_owned(),
        };
        let mut parts = text.trim().rsplitn(3, '/');
        let offset = parts.next().and_then(|o| o.parse::<i64>().ok());
        let partition = parts.next().and_then(|p| p.parse::<u32>().ok());
        let topic = parts.next().filter(|t| !t.is_empty() && !t.contains('/'));
        match (topic, partition, offset) {
            (Some(topic), Some(partition), Some(offset)) if offset >= 0 => {
                Ok(Self::new(topic, partition, offset))
            }
            _ => Err(invalid()),
        }
    }
}

/// What an operator made of a dead letter. A dead letter without a mark is pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterState {
    /// Published again to its origin topic.
    Replayed,
    /// Set aside for good, with a reason.
    Discarded,
}

impl DeadLetterState {
    /// The name stored in `entrega_dlq_state.state` and shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replayed => "replayed",
            Self::Discarded => "discarded",
        }
    }

    /// The state named `name` (as stored), if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "replayed" => Some(Self::Replayed),
            "discarded" => Some(Self::Discarded),
            _ => None,
        }
    }
}

/// The operator state of one dead letter (a row of `entrega_dlq_state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterMark {
    /// Which dead letter.
    pub id: DeadLetterId,
    /// What was done to it.
    pub state: DeadLetterState,
    /// When, in epoch ms.
    pub at_ms: i64,
    /// Who did it.
    pub operator: String,
    /// Why (the discard reason); `None` for replays.
    pub reason: Option<String>,
    /// The replay count the message carried when it was published again (its
    /// `entrega-replays` header); 0 for a dead letter discarded without replay.
    pub replays: u32,
}

/// The kind of an operator action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DlqAction {
    /// Dead letters published again.
    Replay,
    /// Dead letters discarded.
    Discard,
    /// Dead letters the broker had refused, held in a consumer's database, sent on.
    SendHeld,
    /// An outbox row the transport refused, released from holding for the relay to try
    /// again.
    OutboxRelease,
}

impl DlqAction {
    /// The name stored in `entrega_dlq_audit.action`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Discard => "discard",
            Self::SendHeld => "send_held",
            Self::OutboxRelease => "outbox_release",
        }
    }

    /// The action named `name` (as stored), if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "replay" => Some(Self::Replay),
            "discard" => Some(Self::Discard),
            "send_held" => Some(Self::SendHeld),
            "outbox_release" => Some(Self::OutboxRelease),
            _ => None,
        }
    }
}

/// One operator action (a row of `entrega_dlq_audit`): who, when, what, on what, how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqAuditEntry {
    /// When, in epoch ms.
    pub at_ms: i64,
    /// Who (`$USER` or `--operator`).
    pub operator: String,
    /// What.
    pub action: DlqAction,
    /// The selection used, as the operator would write it (`--id ...`, `--motivo ...`).
    pub filter: String,
    /// Whether it was a dry run (nothing published, nothing marked).
    pub dry_run: bool,
    /// Dead letters the selection matched.
    pub matched: u64,
    /// Dead letters replayed or discarded (would have been, in a dry run).
    pub applied: u64,
    /// Dead letters refused (replay limit reached, or held behind a refused one of their key).
    pub refused: u64,
    /// Anything else worth keeping: the discard reason, the target group, the replay limit.
    pub detail: Option<String>,
}

/// Operator state and audit of dead letters, in the service's database.
#[async_trait]
pub trait DlqStore: Send + Sync {
    /// Every mark of dead letters of `dlq_topic`, in partition and offset order.
    async fn marks(&self, dlq_topic: &str) -> Result<Vec<DeadLetterMark>, StoreError>;

    /// Records one action: its audit entry and the marks it sets, in one transaction (both or
    /// neither). A mark replaces an earlier mark of the same dead letter.
    async fn record(
        &self,
        entry: &DlqAuditEntry,
        marks: &[DeadLetterMark],
    ) -> Result<(), StoreError>;

    /// The latest `limit` audit entries, newest first.
    async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, StoreError>;

    /// Takes the store's action lock for `holder` until `expires_at_ms`, unless another
    /// holder has it and its lease has not ended at `now_ms`: whether `holder` has it now.
    /// One replay or discard acts at a time, so two confirmations of one selection never
    /// both publish it.
    async fn lock_actions(
        &self,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Gives the action lock back, if `holder` has it.
    async fn unlock_actions(&self, holder: &str) -> Result<(), StoreError>;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        let id = DeadLetterId::new("pedidos.eventos.dlq", 2, 17);
        assert_eq!(id.to_string(), "pedidos.eventos.dlq/2/17");
        assert_eq!(id.to_string().parse::<DeadLetterId>().unwrap(), id);
    }

    #[test]
    fn malformed_ids_are_refused() {
        for text in [
            "",
            "pedidos.eventos.dlq",
            "pedidos.eventos.dlq/0",
            "/0/1",
            "t/x/1",
            "t/0/-1",
            "t/0/1.5",
            "a/b/0/1",
        ] {
            assert!(text.parse::<DeadLetterId>().is_err(), "{text} parsed");
        }
    }

    #[test]
    fn states_and_actions_round_trip_through_their_names() {
        for s in [DeadLetterState::Replayed, DeadLetterState::Discarded] {
            assert_eq!(DeadLetterState::parse(s.as_str()), Some(s));
        }
        for a in [
            DlqAction::Replay,
            DlqAction::Discard,
            DlqAction::SendHeld,
            DlqAction::OutboxRelease,
        ] {
            assert_eq!(DlqAction::parse(a.as_str()), Some(a));
        }
        assert_eq!(DeadLetterState::parse("pending"), None);
    }
}
