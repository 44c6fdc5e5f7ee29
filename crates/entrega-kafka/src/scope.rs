//! Which librdkafka properties concern which kind of client, so that one URL can carry
//! producer and consumer settings without every client warning about the other's.

/// Which kind of client a set of properties is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The publisher.
    Producer,
    /// Group members and readers.
    Consumer,
    /// The topic admin.
    Admin,
}

/// Property names (or prefixes) librdkafka applies only to producers.
const PRODUCER_ONLY: &[&str] = &[
    "linger.ms",
    "queue.buffering.",
    "batch.",
    "acks",
    "request.required.acks",
    "compression.",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "enable.idempotence",
    "partitioner",
    "sticky.partitioning.linger.ms",
    "transactional.id",
    "transaction.timeout.ms",
    "message.send.max.retries",
    "retries",
];

/// Property names (or prefixes) librdkafka applies only to consumers.
const CONSUMER_ONLY: &[&str] = &[
    "fetch.",
    "queued.",
    "group.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "auto.offset.reset",
    "auto.commit.interval.ms",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "partition.assignment.strategy",
    "max.poll.interval.ms",
    "isolation.level",
    "check.crcs",
    "consume.callback.max.messages",
];

impl Role {
    /// Whether a property named `name` is applied to a client of this role: everything
    /// except what librdkafka knows to belong only to another kind of client.
    pub(crate) fn takes(self, name: &str) -> bool {
        let producer_only = PRODUCER_ONLY.iter().any(|p| name.starts_with(p));
        let consumer_only = CONSUMER_ONLY.iter().any(|p| name.starts_with(p));
        match self {
            Self::Producer => !consumer_only,
            Self::Consumer => !producer_only,
            Self::Admin => !producer_only && !consumer_only,
        }
    }
}
