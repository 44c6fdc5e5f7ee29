//! How a delivery ends, and how handlers say why they failed.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The end of one delivery. Every delivery ends in exactly one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The effect is committed (or was already, for a duplicate); the offset may advance.
    Ack,
    /// A transient failure: deliver the message again no earlier than `after`.
    Retry {
        /// Delay before the next attempt.
        after: Duration,
    },
    /// A permanent failure, or retries exhausted: set the message aside with a reason.
    DeadLetter {
        /// Why, readable by an operator.
        reason: String,
    },
}

/// Whether a failure may go away by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// May succeed if tried again later (database restarting, dependency answering 503).
    Transient,
    /// Will fail again however often it is tried (invalid data, business rule violated).
    Permanent,
}

/// A handler's failure, classified. Retry-versus-dead-letter is decided only by the class.
#[derive(Debug)]
pub struct HandlerError {
    class: ErrorClass,
    source: Box<dyn StdError + Send + Sync + 'static>,
}

impl HandlerError {
    /// A failure that may succeed when retried.
    pub fn transient(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            class: ErrorClass::Transient,
            source: source.into(),
        }
    }

    /// A failure that will not succeed when retried.
    pub fn permanent(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            class: ErrorClass::Permanent,
            source: source.into(),
        }
    }

    /// The failure's class.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// Whether the failure may go away when retried.
    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }

    /// The underlying error.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self.source.as_ref()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = match self.class {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        };
        write!(f, "{class}: {}", self.source)
    }
}

impl StdError for HandlerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(self.source.as_ref())
    }
}

impl From<crate::StoreError> for HandlerError {
    fn from(e: crate::StoreError) -> Self {
        if e.is_transient() {
            Self::transient(e)
        } else {
            Self::permanent(e)
        }
    }
}

impl From<crate::EnvelopeError> for HandlerError {
    fn from(e: crate::EnvelopeError) -> Self {
        Self::permanent(e)
    }
}
