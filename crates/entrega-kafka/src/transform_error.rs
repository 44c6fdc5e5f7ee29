//! Errors of the transactional transformer, and what each failed step means for the loop:
//! abort the transaction and read the batch again, or stop.

use entrega_core::{ErrorClass, HandlerError, TransportError};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::transport;

/// Why a [`crate::KafkaTransformer`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransformError {
    /// Another instance registered the same `transactional.id`: this one is a zombie and
    /// must not write again. Nothing of its open transaction becomes visible.
    #[error("fenced at {step}: another instance registered this transactional id")]
    Fenced {
        /// The step that was refused (`commit_transaction`, a topic's delivery, ...).
        step: String,
    },
    /// The transform refused a batch for good.
    #[error("the transform refused a batch")]
    Transform(#[source] HandlerError),
    /// The cluster or the settings: unreachable brokers at start-up, bad properties, or a
    /// fatal producer error.
    #[error(transparent)]
    Transport(TransportError),
}

/// The outcome of a failed step of one transaction.
#[derive(Debug)]
pub(crate) enum Step {
    /// Abort the transaction, rewind the consumer to the batch, back off, go on.
    Abort(TransformError),
    /// Stop the transformer.
    Fatal(TransformError),
}

impl Step {
    /// A transient transform error is retried; a permanent one stops the loop.
    pub(crate) fn from_handler(e: HandlerError) -> Self {
        match e.class() {
            ErrorClass::Transient => Self::Abort(TransformError::Transform(e)),
            _ => Self::Fatal(TransformError::Transform(e)),
        }
    }
}

/// Whether `code` says another producer registered this transactional id.
pub(crate) fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::InvalidProducerIdMapping
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

/// Classifies a librdkafka error of a transactional step done on `what`.
pub(crate) fn step_error(err: KafkaError, what: &str) -> Step {
    let code = match &err {
        KafkaError::Transaction(e) => Some(e.code()),
        other => other.rdkafka_error_code(),
    };
    if code.is_some_and(is_fenced) {
        return Step::Fatal(TransformError::Fenced {
            step: what.to_owned(),
        });
    }
    let fatal = match &err {
        KafkaError::Transaction(e) => e.is_fatal(),
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => true,
        _ => code == Some(RDKafkaErrorCode::Fatal),
    };
    let error = TransformError::Transport(transport(err, what));
    if fatal {
        Step::Fatal(error)
    } else {
        Step::Abort(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_producer_stops_the_loop() {
        let step = step_error(
            KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
            "commit_transaction",
        );
        assert!(matches!(
            step,
            Step::Fatal(TransformError::Fenced { step }) if step == "commit_transaction"
        ));
    }

    #[test]
    fn a_lost_generation_or_an_outage_aborts_and_retries() {
        for code in [
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::RebalanceInProgress,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::MessageTimedOut,
        ] {
            let step = step_error(KafkaError::MessageProduction(code), "t");
            assert!(matches!(step, Step::Abort(_)), "{code:?}: {step:?}");
        }
    }

    #[test]
    fn handler_classes_decide() {
        let transient = Step::from_handler(HandlerError::transient("db down"));
        assert!(matches!(
            transient,
            Step::Abort(TransformError::Transform(_))
        ));
        let permanent = Step::from_handler(HandlerError::permanent("bug"));
        assert!(matches!(
            permanent,
            Step::Fatal(TransformError::Transform(_))
        ));
    }
}
