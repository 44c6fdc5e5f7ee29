//! Why a record was dead-lettered, in a form operators can count and filter on: a class from a
//! fixed set, the handler's own short code when it gave one, and the free text (`motivo`).

use std::fmt;

/// What kind of failure dead-lettered a record. Travels as the `entrega-class` header of the
/// dead letter and labels `entrega_dead_letters_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadClass {
    /// The payload is not a readable envelope (not JSON, too large, too deep, fields missing).
    Unreadable,
    /// A readable envelope whose `tipo` no handler takes and the router does not ignore.
    UnknownType,
    /// The handler refused it for good (a permanent error).
    Rejected,
    /// It failed transiently on every attempt the worker allows.
    Exhausted,
    /// It came back from the retry topic with retry headers that cannot be read.
    BadRetryHeaders,
    /// A readable envelope that breaks its contract: a version this consumer cannot read
    /// (newer, or older with no upcaster), or `datos` that does not fit the schema. Replay
    /// once the consumer is fixed (the seed's `esquema`).
    Schema,
}

impl DeadClass {
    /// Every class, in a stable order.
    pub const ALL: [DeadClass; 6] = [
        Self::Unreadable,
        Self::UnknownType,
        Self::Rejected,
        Self::Exhausted,
        Self::BadRetryHeaders,
        Self::Schema,
    ];

    /// The wire name (`ilegible`, `tipo_desconocido`, `rechazado`, `agotado`,
    /// `cabeceras_invalidas`, `esquema`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unreadable => "ilegible",
            Self::UnknownType => "tipo_desconocido",
            Self::Rejected => "rechazado",
            Self::Exhausted => "agotado",
            Self::BadRetryHeaders => "cabeceras_invalidas",
            Self::Schema => "esquema",
        }
    }

    /// The class of a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for DeadClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a dead letter says about why it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadReason {
    /// The kind of failure.
    pub class: DeadClass,
    /// The handler's short, fixed code for it (`sin_stock`), if it gave one
    /// ([`crate::HandlerError::with_code`]); the `entrega-code` header.
    pub code: Option<String>,
    /// The full reason, for a person (`motivo`).
    pub text: String,
}

impl DeadReason {
    /// A reason of `class` with no code.
    pub fn new(class: DeadClass, text: impl Into<String>) -> Self {
        Self {
            class,
            code: None,
            text: text.into(),
        }
    }

    /// What to count it under: the handler's code, or else its class's name.
    pub fn counted_as(&self) -> &str {
        self.code.as_deref().unwrap_or(self.class.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_trip_by_name() {
        for class in DeadClass::ALL {
            assert_eq!(DeadClass::parse(class.as_str()), Some(class));
        }
        assert_eq!(DeadClass::parse("otra"), None);
    }

    #[test]
    fn the_motivo_is_the_code_when_there_is_one() {
        let mut reason = DeadReason::new(DeadClass::Rejected, "out of stock: queso");
        assert_eq!(reason.counted_as(), "rechazado");
        reason.code = Some("sin_stock".into());
        assert_eq!(reason.counted_as(), "sin_stock");
    }
}
