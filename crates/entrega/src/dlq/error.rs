//! Why a dead-letter operation was refused or failed.

use entrega_core::{DeadLetterId, InvalidDeadLetterId, StoreError, TransportError};

/// An error of the dead-letter tooling. [`DlqError::is_usage`] tells the operator's mistakes
/// (nothing was changed) from failures of the transport or the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DlqError {
    /// Filters that cannot be combined, or that select nothing by construction.
    #[error("conflicting filters: {reason}")]
    ConflictingFilters {
        /// Which filters, and why.
        reason: String,
    },
    /// A dead-letter id that is not well formed.
    #[error(transparent)]
    InvalidId(#[from] InvalidDeadLetterId),
    /// No record at the place an id names.
    #[error("no dead letter {id}: the topic has no record at that partition and offset")]
    UnknownId {
        /// The id asked for.
        id: DeadLetterId,
    },
    /// An id names a topic the tool does not tend.
    #[error("dead letter {id} is not on a dead-letter topic (expected one of: {topics})")]
    NotADeadLetterTopic {
        /// The id asked for.
        id: DeadLetterId,
        /// The topics tended, comma-separated.
        topics: String,
    },
    /// A topic or queue the tool does not tend.
    #[error("`{topic}` is not tended here (tended: {tended})")]
    NotTended {
        /// The topic or queue asked for.
        topic: String,
        /// What is tended.
        tended: String,
    },
    /// An id names a dead letter an operator already replayed or discarded.
    #[error("dead letter {id} is already {state}; nothing to do")]
    NotPending {
        /// The id asked for.
        id: DeadLetterId,
        /// What was done to it.
        state: &'static str,
    },
    /// A discard without a reason.
    #[error("a discard needs a reason (--reason \"...\")")]
    ReasonRequired,
    /// A replay limit of 0 would refuse every dead letter.
    #[error("the replay limit must be at least 1")]
    ZeroReplayLimit,
    /// A replay to one group needs the replay key to sign it: without a valid signature
    /// every group's consumers would handle it.
    #[error("a replay to one group needs the replay key (KM0_REPLAY_KEY) to sign it")]
    NoReplayKey,
    /// The selection no longer matches what the operator confirmed (after a dry run): other
    /// dead letters arrived, or some were handled meanwhile. Nothing was done.
    #[error(
        "the selection changed: {matched} dead letters match now, {expected} were confirmed; \
         look again (dry run) before acting"
    )]
    SelectionChanged {
        /// How many the operator confirmed.
        expected: usize,
        /// How many match now.
        matched: usize,
    },
    /// The dead letters that match are not those the operator confirmed (some were handled,
    /// others arrived). Nothing was done.
    #[error(
        "the selection changed: the {matched} dead letters that match now are not the ones \
         confirmed; look again (dry run) before acting"
    )]
    SelectionReplaced {
        /// How many match now.
        matched: usize,
    },
    /// Another replay or discard holds the action lock (or one that stopped without
    /// finishing held it less than its lease ago). Nothing was done.
    #[error(
        "another replay or discard is under way (or one stopped unfinished less than {} s \
         ago); try again", super::ACTION_LEASE.as_secs()
    )]
    Busy,
    /// Reading or publishing records failed.
    #[error("the transport failed")]
    Transport(#[from] TransportError),
    /// Reading or writing operator state failed.
    #[error("the dead-letter state store failed")]
    Store(#[from] StoreError),
}

impl DlqError {
    /// Whether the request itself was at fault (bad id, conflicting filters, missing reason):
    /// detected before anything was published or recorded.
    pub fn is_usage(&self) -> bool {
        !matches!(self, Self::Transport(_) | Self::Store(_))
    }

    /// Whether repeating the operation later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport(e) => e.is_transient(),
            Self::Store(e) => e.is_transient(),
            Self::Busy => true,
            _ => false,
        }
    }

    /// Refuses an action whose selection, `matched` now, is not the `expected` count the
    /// operator confirmed.
    fn check_expected(expected: Option<usize>, matched: usize) -> Result<(), Self> {
        match expected {
            Some(expected) if expected != matched => {
                Err(Self::SelectionChanged { expected, matched })
            }
            _ => Ok(()),
        }
    }

    /// Refuses an action whose selection (`matched` letters named by the token `selection`)
    /// is not what the operator confirmed: `expected` letters, named by `expected_selection`,
    /// each when given.
    pub(super) fn check_confirmed(
        expected: Option<usize>,
        expected_selection: Option<&str>,
        selection: &str,
        matched: usize,
    ) -> Result<(), Self> {
        Self::check_expected(expected, matched)?;
        Self::check_selection(expected_selection, selection, matched)
    }

    /// Refuses an action whose selection's token, `actual` (of `matched` letters), is not the
    /// `expected` one the operator confirmed.
    fn check_selection(expected: Option<&str>, actual: &str, matched: usize) -> Result<(), Self> {
        match expected {
            Some(expected) if expected != actual => Err(Self::SelectionReplaced { matched }),
            _ => Ok(()),
        }
    }
}
