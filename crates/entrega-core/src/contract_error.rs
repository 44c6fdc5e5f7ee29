//! Why an event does not meet its contract. Every case is permanent: the same bytes fail the
//! same way on every attempt, so a consumer dead-letters them with class `esquema`, and a
//! producer gets the error in its own transaction instead of an outbox row.

use crate::HandlerError;

/// An event that does not meet its contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// The event is of another `tipo` than the one being read.
    #[error("expected a `{expected}` event, got `{got}`")]
    WrongType {
        /// The `tipo` wanted.
        expected: String,
        /// The `tipo` received.
        got: String,
    },
    /// A version newer than the reader knows (versions are never downcast).
    #[error("`{tipo}` version {version} is newer than version {understood}, the newest this consumer reads")]
    Newer {
        /// The event type.
        tipo: String,
        /// The version received.
        version: u32,
        /// The version the reader is written for.
        understood: u32,
    },
    /// An older version with no registered way up to the reader's.
    #[error("`{tipo}` version {version} cannot be read: no upcaster from version {missing} to {next} (this consumer reads version {understood})", next = .missing + 1)]
    NoPath {
        /// The event type.
        tipo: String,
        /// The version received.
        version: u32,
        /// The version the reader is written for.
        understood: u32,
        /// The first version with no step to the next.
        missing: u32,
    },
    /// An upcaster refused the event.
    #[error("`{tipo}` version {from} could not be upcast to version {to}: {reason}", to = .from + 1)]
    Upcast {
        /// The event type.
        tipo: String,
        /// The version the failing step starts from.
        from: u32,
        /// The upcaster's reason.
        reason: String,
    },
    /// `datos` does not match the schema of its version.
    #[error("`{tipo}` version {version}: `{field}` {reason}")]
    Invalid {
        /// The event type.
        tipo: String,
        /// The version whose schema it fails.
        version: u32,
        /// Where, as a path of member names (`lineas[0].cantidad`); `datos` for the whole.
        field: String,
        /// What is wrong there.
        reason: String,
    },
    /// No contract is registered for this `tipo` and version.
    #[error("no contract for `{tipo}` version {version}")]
    Unregistered {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
    },
}

impl ContractError {
    /// The field the error is about, when it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The short code a dead letter carries (`entrega-code`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::WrongType { .. } => "wrong_type",
            Self::Newer { .. } => "newer_version",
            Self::NoPath { .. } => "no_upcaster",
            Self::Upcast { .. } => "upcast_failed",
            Self::Invalid { .. } => "invalid_data",
            Self::Unregistered { .. } => "no_contract",
        }
    }
}

impl From<ContractError> for HandlerError {
    fn from(e: ContractError) -> Self {
        let code = e.code();
        HandlerError::contract(e).with_code(code)
    }
}
