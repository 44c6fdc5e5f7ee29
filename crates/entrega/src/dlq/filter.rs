//! Which dead letters an operation applies to.

use entrega_core::{DeadClass, DeadLetterId};

use super::error::DlqError;
use super::letter::DeadLetter;

/// A selection of dead letters. Filters combine (all must hold); `ids` name dead letters
/// exactly and combine with nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DlqFilter {
    /// Exactly these dead letters.
    pub ids: Vec<DeadLetterId>,
    /// Only this dead-letter topic (`<topic>.dlq`).
    pub topic: Option<String>,
    /// Only this event type (`tipo`), exactly.
    pub kind: Option<String>,
    /// Only reasons (`motivo`) containing this text, ignoring case.
    pub reason: Option<String>,
    /// Only dead letters of this kind of failure (`entrega-class`).
    pub failure: Option<DeadClass>,
    /// Only dead letters written at or after this time (epoch ms).
    pub since_ms: Option<i64>,
    /// Only dead letters written at or before this time (epoch ms).
    pub until_ms: Option<i64>,
}

impl DlqFilter {
    /// Every dead letter of the tended topics.
    pub fn all() -> Self {
        Self::default()
    }

    /// Exactly the dead letter `id`.
    pub fn id(id: DeadLetterId) -> Self {
        Self {
            ids: vec![id],
            ..Self::default()
        }
    }

    /// Builder form: only this dead-letter topic.
    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Builder form: only this `tipo`.
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Builder form: only dead letters of this kind of failure.
    pub fn with_failure(mut self, class: DeadClass) -> Self {
        self.failure = Some(class);
        self
    }

    /// Builder form: only reasons containing `text`.
    pub fn with_reason(mut self, text: impl Into<String>) -> Self {
        self.reason = Some(text.into());
        self
    }

    /// Builder form: only dead letters written within `[since_ms, until_ms]` (either open).
    pub fn with_time(mut self, since_ms: Option<i64>, until_ms: Option<i64>) -> Self {
        self.since_ms = since_ms;
        self.until_ms = until_ms;
        self
    }

    /// Refuses filters that contradict each other.
    pub fn validate(&self) -> Result<(), DlqError> {
        let others: Vec<&str> = [
            (self.topic.is_some(), "--topic"),
            (self.kind.is_some(), "--tipo"),
            (self.reason.is_some(), "--motivo"),
            (self.failure.is_some(), "--clase"),
            (self.since_ms.is_some(), "--since"),
            (self.until_ms.is_some(), "--until"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        if !self.ids.is_empty() && !others.is_empty() {
            return Err(DlqError::ConflictingFilters {
                reason: format!(
                    "--id names dead letters exactly and cannot be combined with {}",
                    others.join(", ")
                ),
            });
        }
        if let (Some(since), Some(until)) = (self.since_ms, self.until_ms) {
            if since > until {
                return Err(DlqError::ConflictingFilters {
                    reason: format!(
                        "--since ({since} ms) is after --until ({until} ms): nothing can match"
                    ),
                });
            }
        }
        for (value, name) in [(&self.kind, "--tipo"), (&self.reason, "--motivo")] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(DlqError::ConflictingFilters {
                    reason: format!("{name} is empty"),
                });
            }
        }
        Ok(())
    }

    /// Whether `letter` is selected (its state aside).
    pub fn matches(&self, letter: &DeadLetter) -> bool {
        if !self.ids.is_empty() {
            return self.ids.contains(&letter.id);
        }
        let topic = self.topic.as_ref().is_none_or(|t| *t == letter.id.topic);
        let kind = self
            .kind
            .as_ref()
            .is_none_or(|t| letter.kind.as_deref() == Some(t.as_str()));
        let reason = self
            .reason
            .as_ref()
            .is_none_or(|m| letter.reason.to_lowercase().contains(&m.to_lowercase()));
        let failure = self.failure.is_none_or(|c| letter.failure == Some(c));
        let since = self.since_ms.is_none_or(|s| letter.timestamp_ms >= s);
        let until = self.until_ms.is_none_or(|u| letter.timestamp_ms <= u);
        topic && kind && reason && failure && since && until
    }

    /// The selection as an operator would type it, for the audit.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.ids.iter().map(|id| format!("--id {id}")).collect();
        let texts = [
            ("--topic", &self.topic),
            ("--tipo", &self.kind),
            ("--motivo", &self.reason),
        ];
        for (name, value) in texts {
            if let Some(v) = value {
                parts.push(format!("{name} {v:?}"));
            }
        }
        if let Some(c) = self.failure {
            parts.push(format!("--clase {c}"));
        }
        if let Some(s) = self.since_ms {
            parts.push(format!("--since {s}"));
        }
        if let Some(u) = self.until_ms {
            parts.push(format!("--until {u}"));
        }
        if parts.is_empty() {
            "(all)".to_owned()
        } else {
            parts.join(" ")
        }
    }
}
