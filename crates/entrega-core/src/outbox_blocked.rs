//! Outbox rows the transport refused: what the relay records about them, how operators see
//! them, and releasing a held one.
//!
//! A row the transport refuses for good (too large, unknown topic) gets `attempts + 1`, the
//! last error and either a next-attempt time (`next_attempt_at`) or, once the relay's attempt
//! limit is reached, a holding time (`held_at`). While an aggregate's earliest pending row
//! is blocked (waiting for its next attempt, or held), the pending reads skip every later
//! row of that aggregate, so only the aggregate waits and its lane flows.

use uuid::Uuid;

use crate::StoreError;

/// Longest last-error text kept on a row, in characters; longer texts are cut.
pub const MAX_ERROR_CHARS: usize = 1_000;

/// What the relay records about a row the transport refused
/// ([`crate::OutboxReader::record_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The refused row.
    pub id: Uuid,
    /// Why the transport refused it, at most [`MAX_ERROR_CHARS`] characters.
    pub error: String,
    /// When to try the row again (epoch ms); `None` holds it until an operator releases it.
    pub retry_at_ms: Option<i64>,
}

impl Refusal {
    /// A refusal to retry at `retry_at_ms`; `error` is cut to [`MAX_ERROR_CHARS`].
    pub fn retry(id: Uuid, error: &str, retry_at_ms: i64) -> Self {
        Self {
            id,
            error: truncate_error(error),
            retry_at_ms: Some(retry_at_ms),
        }
    }

    /// A refusal that holds the row; `error` is cut to [`MAX_ERROR_CHARS`].
    pub fn hold(id: Uuid, error: &str) -> Self {
        Self {
            id,
            error: truncate_error(error),
            retry_at_ms: None,
        }
    }

    /// Whether this refusal holds the row.
    pub fn holds(&self) -> bool {
        self.retry_at_ms.is_none()
    }
}

/// `error` cut to at most [`MAX_ERROR_CHARS`] characters, on a character boundary.
pub fn truncate_error(error: &str) -> String {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((end, _)) => error[..end].to_owned(),
        None => error.to_owned(),
    }
}

/// A pending row the transport refused, as operators see it ([`crate::OutboxStatus`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockedRow {
    /// Row id (`id_evento`).
    pub id: Uuid,
    /// Aggregate type (`agregado`).
    pub aggregate: String,
    /// Aggregate id (`agregado_id`); its later rows wait behind this one.
    pub aggregate_id: String,
    /// Event type (`tipo`).
    pub kind: String,
    /// Refused publishing attempts (`attempts`).
    pub attempts: u32,
    /// Next attempt in epoch ms (`next_attempt_at`); `None` once held.
    pub next_attempt_ms: Option<i64>,
    /// Why the transport last refused it (`last_error`).
    pub last_error: Option<String>,
    /// When it was held, in epoch ms (`held_at`); `None` while it is still retried.
    pub held_at_ms: Option<i64>,
}

impl BlockedRow {
    /// Whether the row is held (waits for an operator).
    pub fn is_held(&self) -> bool {
        self.held_at_ms.is_some()
    }
}

/// At most this many blocked rows are listed by a status (the counts cover all of them).
pub const BLOCKED_ROWS_LISTED: usize = 100;

/// Why releasing a held row failed ([`crate::OutboxMaintenance::release`]); nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReleaseError {
    /// No outbox row has this id.
    #[error("no outbox row {id}")]
    UnknownRow {
        /// The id asked for.
        id: Uuid,
    },
    /// The row exists but is not held (pending and flowing, waiting for a retry, or
    /// published).
    #[error("outbox row {id} is not held")]
    NotHeld {
        /// The id asked for.
        id: Uuid,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ReleaseError {
    /// Whether repeating the release later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::UnknownRow { .. } | Self::NotHeld { .. } => false,
            Self::Store(e) => e.is_transient(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_cut_on_a_character_boundary() {
        let long = "ñ".repeat(MAX_ERROR_CHARS + 10);
        let cut = truncate_error(&long);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncate_error("short"), "short");
        let refusal = Refusal::hold(Uuid::nil(), &long);
        assert!(refusal.holds());
        assert_eq!(refusal.error.chars().count(), MAX_ERROR_CHARS);
        assert!(!Refusal::retry(Uuid::nil(), "x", 5).holds());
    }

    #[test]
    fn release_errors_are_permanent_unless_the_store_is_down() {
        let id = Uuid::nil();
        assert!(!ReleaseError::UnknownRow { id }.is_transient());
        assert!(!ReleaseError::NotHeld { id }.is_transient());
        let down = ReleaseError::from(StoreError::unavailable("refused"));
        assert!(down.is_transient());
        assert_eq!(
            ReleaseError::NotHeld { id }.to_string(),
            format!("outbox row {id} is not held")
        );
    }
}
