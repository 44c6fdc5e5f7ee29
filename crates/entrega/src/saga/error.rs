//! What can go wrong with a saga, classified: a conflict or an unreachable database may pass
//! if tried again; a reply that cannot be read or a flow that cannot build a command will not.

use entrega_core::StoreError;

use super::flow::FlowError;
use super::record::SagaStatus;

/// An error of the saga engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SagaError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The saga changed between its read and its write (another orchestrator moved it).
    #[error("saga `{id}` changed after it was read at version {version}")]
    Conflict {
        /// The saga.
        id: String,
        /// The version it was read at.
        version: i64,
    },
    /// No saga of this type has that id.
    #[error("no saga `{kind}` with id `{id}`")]
    NotFound {
        /// The saga type.
        kind: String,
        /// The id asked for.
        id: String,
    },
    /// An operator's retry of a saga that is not waiting for one.
    #[error("saga `{id}` is {status}, not waiting for an operator")]
    NotWaiting {
        /// The saga.
        id: String,
        /// Where it stands.
        status: SagaStatus,
    },
    /// A reply event the flow cannot read.
    #[error("unreadable saga reply: {0}")]
    BadReply(#[source] FlowError),
    /// The flow could not build a command or compensation.
    #[error("saga command could not be built: {0}")]
    Flow(#[source] FlowError),
}

impl SagaError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Store(e) => e.is_transient(),
            Self::Conflict { .. } => true,
            Self::NotFound { .. } | Self::NotWaiting { .. } | Self::BadReply(_) | Self::Flow(_) => {
                false
            }
        }
    }
}
