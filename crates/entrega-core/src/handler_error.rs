//! How handlers say why they failed: a transient failure is retried, a permanent one is
//! dead-lettered at once. The worker decides the rest from this class alone.

use std::error::Error as StdError;
use std::fmt;

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
    /// A permanent failure of the event's contract rather than of the handler's rules.
    contract: bool,
    code: Option<String>,
    source: Box<dyn StdError + Send + Sync + 'static>,
}

impl HandlerError {
    /// A failure that may succeed when retried.
    pub fn transient(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            class: ErrorClass::Transient,
            contract: false,
            code: None,
            source: source.into(),
        }
    }

    /// A failure that will not succeed when retried.
    pub fn permanent(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            class: ErrorClass::Permanent,
            contract: false,
            code: None,
            source: source.into(),
        }
    }

    /// The event breaks its contract (a version the consumer cannot read, `datos` that does
    /// not fit its schema): permanent, dead-lettered with class
    /// [`DeadClass::Schema`](crate::DeadClass::Schema) so it can be replayed once the consumer
    /// is fixed.
    pub fn contract(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            contract: true,
            ..Self::permanent(source)
        }
    }

    /// The class of dead letter a permanent failure becomes: [`DeadClass::Schema`] for
    /// [`HandlerError::contract`], otherwise [`DeadClass::Rejected`].
    ///
    /// [`DeadClass::Schema`]: crate::DeadClass::Schema
    /// [`DeadClass::Rejected`]: crate::DeadClass::Rejected
    pub fn dead_class(&self) -> crate::DeadClass {
        if self.contract {
            crate::DeadClass::Schema
        } else {
            crate::DeadClass::Rejected
        }
    }

    /// Names why it failed with a short, fixed code (`sin_stock`, `producto_desconocido`):
    /// a dead letter carries it (`entrega-code`) and dead letters are counted by it. Keep
    /// the set of codes small: each is a metric label value.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The code given with [`HandlerError::with_code`], if any.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
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
        // A contract's failure reads as the seed's dead-letter reason (`motivo esquema`).
        let class = match self.class {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent if self.contract => "esquema",
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
        if let crate::StoreError::Contract(e) = e {
            return e.into();
        }
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
