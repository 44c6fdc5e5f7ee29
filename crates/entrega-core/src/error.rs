//! Errors of stores and transports, each with a transient/permanent classifier.

use std::error::Error as StdError;

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// An error from a database-backed store (outbox, inbox, log tables, leases).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or the operation may succeed if repeated
    /// (connection refused, pool timeout, serialization failure, deadlock, busy file).
    #[error("database unavailable: {source}")]
    Unavailable {
        /// The driver's error.
        #[source]
        source: Source,
    },
    /// The database rejected the operation; repeating it will not help.
    #[error("database rejected the operation: {source}")]
    Rejected {
        /// The driver's error.
        #[source]
        source: Source,
    },
    /// A row could not be decoded into the expected shape.
    #[error("corrupt row in `{table}`: {reason}")]
    Corrupt {
        /// Table the row came from.
        table: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A lease this instance relied on is held by someone else now.
    #[error("lease on {what} was lost")]
    LeaseLost {
        /// What the lease covered.
        what: String,
    },
    /// An event refused before it reached the outbox: it does not meet its contract. Nothing
    /// was written; the caller's transaction is still open and may go on or roll back.
    #[error("event refused: {0}")]
    Contract(#[from] crate::ContractError),
    /// The schema in the database is newer than this build understands.
    #[error("database schema version {found} is newer than the supported {supported}")]
    SchemaTooNew {
        /// Version found.
        found: i64,
        /// Latest version this build knows.
        supported: i64,
    },
}

impl StoreError {
    /// Whether repeating the operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::LeaseLost { .. })
    }

    /// Wraps a transient driver error.
    pub fn unavailable(source: impl Into<Source>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }

    /// Wraps a permanent driver error.
    pub fn rejected(source: impl Into<Source>) -> Self {
        Self::Rejected {
            source: source.into(),
        }
    }
}

/// An error from a message transport (log transport, Kafka, AMQP).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The broker is unreachable or overloaded; the operation may succeed later.
    #[error("transport unavailable: {source}")]
    Unavailable {
        /// The underlying error.
        #[source]
        source: Source,
    },
    /// The broker refused this message; resending it unchanged will fail again.
    #[error("message rejected by transport: {reason}")]
    Rejected {
        /// Why.
        reason: String,
    },
    /// The topic does not exist.
    #[error("unknown topic `{topic}`")]
    UnknownTopic {
        /// The topic asked for.
        topic: String,
    },
    /// This member no longer owns the partition it tried to commit or read.
    #[error("partition {partition} of `{topic}` is no longer assigned to this member")]
    NotAssigned {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
    },
    /// A store underneath the transport failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TransportError {
    /// Whether repeating the operation later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable { .. } | Self::NotAssigned { .. } => true,
            Self::Store(e) => e.is_transient(),
            Self::Rejected { .. } | Self::UnknownTopic { .. } => false,
        }
    }

    /// Wraps a transient error.
    pub fn unavailable(source: impl Into<Source>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }
}
