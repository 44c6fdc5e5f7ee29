//! A saga as stored: its row in `entrega_sagas` and the entries of its history in
//! `entrega_saga_history`, with the names their state columns hold.

use serde_json::{Map, Value};

macro_rules! stored_names {
    ($ty:ident { $($variant:ident => $name:literal was $former:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The name stored in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }

            /// The name an earlier release stored, before the names were English.
            pub fn former(self) -> &'static str {
                match self {
                    $(Self::$variant => $former),+
                }
            }

            /// The value a stored name stands for; the former names are understood too
            /// (an operator's habit, a script written before).
            pub fn parse(name: &str) -> Option<Self> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == name || v.former() == name)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// Where a saga stands (`entrega_sagas.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SagaStatus {
    /// Its steps are running (`running`).
    Running,
    /// Undoing what its steps did (`compensating`).
    Compensating,
    /// Every step done (`completed`).
    Completed,
    /// Every step that may have taken effect undone (`compensated`).
    Compensated,
    /// A compensation failed past its limit: an operator must look (`needs_operator`).
    NeedsOperator,
}

stored_names!(SagaStatus {
    Running => "running" was "en_curso",
    Compensating => "compensating" was "compensando",
    Completed => "completed" was "completada",
    Compensated => "compensated" was "compensada",
    NeedsOperator => "needs_operator" was "requiere_operador",
});

impl SagaStatus {
    /// Whether the saga is over (nothing more happens to it).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Compensated)
    }
}

/// Whether a step's command or its compensation is meant (`phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The step's command (`action`).
    Action,
    /// The step's compensation (`compensation`).
    Compensation,
}

stored_names!(Phase {
    Action => "action" was "accion",
    Compensation => "compensation" was "compensacion",
});

/// One saga's row.
#[derive(Debug, Clone, PartialEq)]
pub struct SagaRecord {
    /// The saga type (`tipo`).
    pub kind: String,
    /// Its id within the type (`saga_id`: the order id for km0's order saga).
    pub id: String,
    /// Where it stands.
    pub status: SagaStatus,
    /// The step being run or compensated (an index of the flow's steps).
    pub step: usize,
    /// Whether that step's command or its compensation is awaited.
    pub phase: Phase,
    /// Sends of the awaited command or compensation so far.
    pub attempts: u32,
    /// What the saga was started with (`datos`).
    pub input: Value,
    /// What each step returned, by step name (`resultados`).
    pub results: Map<String, Value>,
    /// Why it compensates, or waits for an operator.
    pub reason: Option<String>,
    /// When its timer fires next (a resend, the deadline), epoch ms; `None` once final or
    /// waiting for an operator.
    pub next_at_ms: Option<i64>,
    /// When the awaited step's deadline passes, epoch ms (commands only).
    pub deadline_at_ms: Option<i64>,
    /// Entries in its history so far (the next one is numbered `events + 1`).
    pub events: i64,
    /// Bumped by every change: a change is written only over the version it read.
    pub version: i64,
    /// When it started, epoch ms.
    pub created_ms: i64,
    /// When it last changed, epoch ms.
    pub updated_ms: i64,
    /// The `traceparent` of the work that started it (`traza`): the commands it sends
    /// outside any traced work (its timers' resends and deadlines) continue that trace.
    pub trace: Option<String>,
}

impl SagaRecord {
    /// A saga just started: step 0's command about to be sent. Started inside
    /// [`crate::trace::scope`], it keeps that trace for its commands.
    pub fn new(kind: &str, id: &str, input: Value, now_ms: i64) -> Self {
        Self {
            kind: kind.to_owned(),
            id: id.to_owned(),
            status: SagaStatus::Running,
            step: 0,
            phase: Phase::Action,
            attempts: 0,
            input,
            results: Map::new(),
            reason: None,
            next_at_ms: None,
            deadline_at_ms: None,
            events: 0,
            version: 0,
            created_ms: now_ms,
            updated_ms: now_ms,
            trace: crate::trace::current().map(|ctx| ctx.header()),
        }
    }
}

/// What an entry of a saga's history records (`que`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The saga was started (`started`).
    Started,
    /// A command or compensation was sent (`enviado`; `intento` says which send).
    Sent,
    /// A reply was applied (`replied`).
    Replied,
    /// A reply said the step failed (`failed`).
    Failed,
    /// A reply was not applied: late, repeated, or under another key (`ignored`).
    Ignored,
    /// A step's deadline passed with no reply (`deadline_passed`).
    DeadlinePassed,
    /// Compensation began (`compensating`).
    Compensating,
    /// The saga completed (`completed`).
    Completed,
    /// The saga finished compensating (`compensated`).
    Compensated,
    /// A compensation failed past its limit (`needs_operator`).
    NeedsOperator,
    /// A cancel was asked for (`cancel_requested`).
    CancelRequested,
    /// An operator sent a waiting compensation again (`operator_retry`).
    OperatorRetry,
}

stored_names!(EventKind {
    Started => "started" was "iniciada",
    Sent => "sent" was "enviado",
    Replied => "replied" was "respuesta",
    Failed => "failed" was "fallo",
    Ignored => "ignored" was "ignorada",
    DeadlinePassed => "deadline_passed" was "plazo_vencido",
    Compensating => "compensating" was "compensando",
    Completed => "completed" was "completada",
    Compensated => "compensated" was "compensada",
    NeedsOperator => "needs_operator" was "requiere_operador",
    CancelRequested => "cancel_requested" was "cancelacion",
    OperatorRetry => "operator_retry" was "reintento_operador",
});

/// One entry of a saga's history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    /// Its number within the saga, from 1.
    pub n: i64,
    /// When, epoch ms.
    pub at_ms: i64,
    /// What happened.
    pub what: EventKind,
    /// The step concerned, by name (empty for the saga as a whole).
    pub step: String,
    /// Command or compensation.
    pub phase: Phase,
    /// The key sent or answered, if any.
    pub key: Option<String>,
    /// Which send (1 for the first), when one is concerned.
    pub attempt: Option<u32>,
    /// The reply's data, a failure's reason, who asked: what explains the entry.
    pub detail: Option<String>,
}
