//! Mapping librdkafka's errors onto [`TransportError`] and its transient/permanent classes.

use entrega_core::TransportError;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What an error code means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The topic or partition does not exist.
    UnknownTopic,
    /// The request or message can never succeed as it is.
    Permanent,
    /// The member's group generation is gone: its partitions may belong to someone else.
    Fenced,
    /// Anything that may succeed later: broker down, timeouts, leader moves, rebalances.
    Transient,
}

/// Classifies a librdkafka or broker error code.
pub(crate) fn classify(code: RDKafkaErrorCode) -> Class {
    use RDKafkaErrorCode as C;
    match code {
        C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition | C::UnknownTopicId => {
            Class::UnknownTopic
        }
        C::IllegalGeneration
        | C::UnknownMemberId
        | C::FencedInstanceId
        | C::AssignmentLost
        | C::FencedMemberEpoch
        | C::StaleMemberEpoch => Class::Fenced,
        C::MessageSizeTooLarge
        | C::InvalidMessageSize
        | C::MessageBatchTooLarge
        | C::InvalidMessage
        | C::BadMessage
        | C::InvalidRecord
        | C::InvalidTimestamp
        | C::InvalidTopic
        | C::InvalidRequiredAcks
        | C::InvalidPartitions
        | C::InvalidReplicationFactor
        | C::InvalidReplicaAssignment
        | C::InvalidConfig
        | C::InvalidRequest
        | C::InvalidArgument
        | C::InvalidGroupId
        | C::InvalidSessionTimeout
        | C::InvalidCommitOffsetSize
        | C::OffsetMetadataTooLarge
        | C::PolicyViolation
        | C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::UnsupportedVersion
        | C::UnsupportedForMessageFormat
        | C::UnsupportedCompressionType
        | C::UnsupportedFeature
        | C::KeySerialization
        | C::ValueSerialization
        | C::SecurityDisabled
        | C::SaslAuthenticationFailed
        | C::Authentication
        | C::Fatal => Class::Permanent,
        _ => Class::Transient,
    }
}

/// The broker or client error code inside `err`, if it carries one.
pub(crate) fn code_of(err: &KafkaError) -> Option<RDKafkaErrorCode> {
    match err {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    }
}

/// Maps an error of an operation on `topic`.
pub(crate) fn transport(err: KafkaError, topic: &str) -> TransportError {
    let class = match &err {
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) | KafkaError::Nul(_) => {
            Class::Permanent
        }
        KafkaError::MessageConsumptionFatal(_) => Class::Permanent,
        other => code_of(other).map_or(Class::Transient, classify),
    };
    match class {
        Class::UnknownTopic => TransportError::UnknownTopic {
            topic: topic.to_owned(),
        },
        Class::Permanent => TransportError::Rejected {
            reason: err.to_string(),
        },
        Class::Fenced | Class::Transient => TransportError::unavailable(err),
    }
}

/// Maps a failed offset commit of `topic`: a lost generation means the partitions may have
/// moved, so the commit is refused as [`TransportError::NotAssigned`] for `partition`.
pub(crate) fn commit_error(err: KafkaError, topic: &str, partition: u32) -> TransportError {
    match code_of(&err).map(classify) {
        Some(Class::Fenced) => TransportError::NotAssigned {
            topic: topic.to_owned(),
            partition,
        },
        _ => transport(err, topic),
    }
}

/// A misuse of the API with arguments that can never work.
pub(crate) fn invalid(reason: impl Into<String>) -> TransportError {
    TransportError::Rejected {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_topic_is_its_own_error() {
        let e = transport(
            KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition),
            "t",
        );
        assert!(matches!(&e, TransportError::UnknownTopic { topic } if topic == "t"));
        assert!(!e.is_transient());
        let local = transport(
            KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic),
            "t",
        );
        assert!(matches!(local, TransportError::UnknownTopic { .. }));
    }

    #[test]
    fn oversized_messages_are_permanent() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidMessageSize,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::InvalidRecord,
        ] {
            let e = transport(KafkaError::MessageProduction(code), "t");
            assert!(
                matches!(e, TransportError::Rejected { .. }),
                "{code:?}: {e:?}"
            );
            assert!(!e.is_transient(), "{code:?}");
        }
    }

    #[test]
    fn outages_and_leader_moves_are_transient() {
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::LeaderNotAvailable,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::RebalanceInProgress,
        ] {
            let e = transport(KafkaError::MessageProduction(code), "t");
            assert!(
                matches!(e, TransportError::Unavailable { .. }),
                "{code:?}: {e:?}"
            );
            assert!(e.is_transient(), "{code:?}");
        }
    }

    #[test]
    fn lost_generation_on_commit_is_not_assigned() {
        for code in [
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::UnknownMemberId,
            RDKafkaErrorCode::AssignmentLost,
        ] {
            let e = commit_error(KafkaError::ConsumerCommit(code), "t", 3);
            assert!(
                matches!(&e, TransportError::NotAssigned { topic, partition: 3 } if topic == "t"),
                "{code:?}: {e:?}"
            );
        }
        let busy = commit_error(
            KafkaError::ConsumerCommit(RDKafkaErrorCode::RebalanceInProgress),
            "t",
            3,
        );
        assert!(matches!(busy, TransportError::Unavailable { .. }));
        let coordinator = commit_error(
            KafkaError::ConsumerCommit(RDKafkaErrorCode::NotCoordinator),
            "t",
            3,
        );
        assert!(coordinator.is_transient());
    }

    #[test]
    fn bad_configuration_is_permanent() {
        let e = transport(KafkaError::ClientCreation("bad property".into()), "");
        assert!(matches!(e, TransportError::Rejected { .. }));
    }
}
