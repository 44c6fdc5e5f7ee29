//! Read-only views of a partitioned log for operators, tooling and tests: end offsets,
//! committed offsets, and the lag between them.

use async_trait::async_trait;

use crate::{Record, TransportError};

/// Reads a log's positions without joining any consumer group.
#[async_trait]
pub trait LogInspector: Send + Sync {
    /// The next offset to be written in each partition of `topic`, in partition order;
    /// empty when the topic does not exist.
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError>;

    /// The committed next offset of `group` in each partition of `topic` it has committed,
    /// in partition order; partitions without a commit are left out.
    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError>;

    /// Up to `max` records of one partition from offset `from` on, in offset order.
    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError>;

    /// How many members of `group` are alive on `topic` now (joined and heartbeating), or
    /// `None` when this transport cannot tell. Zero means nobody consumes it at the moment:
    /// its lag only grows.
    async fn members(&self, group: &str, topic: &str) -> Result<Option<u32>, TransportError> {
        let _ = (group, topic);
        Ok(None)
    }
}

/// How far one consumer group is behind in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    /// The partition.
    pub partition: u32,
    /// The group's committed next offset, `None` if it never committed here.
    pub committed: Option<i64>,
    /// The partition's end offset (next offset to be written).
    pub end: i64,
}

impl PartitionLag {
    /// Records written and not yet committed by the group; a partition never committed
    /// counts from its start (offset 0), as a group reading from the earliest offset would.
    pub fn lag(&self) -> i64 {
        (self.end - self.committed.unwrap_or(0)).max(0)
    }
}

/// The lag of `group` on every partition of `topic`, in partition order.
pub async fn group_lag(
    inspector: &dyn LogInspector,
    group: &str,
    topic: &str,
) -> Result<Vec<PartitionLag>, TransportError> {
    let ends = inspector.end_offsets(topic).await?;
    let committed = inspector.committed(group, topic).await?;
    Ok(ends
        .into_iter()
        .map(|(partition, end)| PartitionLag {
            partition,
            committed: committed
                .iter()
                .find(|(p, _)| *p == partition)
                .map(|(_, next)| *next),
            end,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_from_start_without_commit_and_never_goes_negative() {
        let never = PartitionLag {
            partition: 0,
            committed: None,
            end: 7,
        };
        assert_eq!(never.lag(), 7);
        let ahead = PartitionLag {
            partition: 1,
            committed: Some(9),
            end: 7,
        };
        assert_eq!(ahead.lag(), 0);
        let behind = PartitionLag {
            partition: 2,
            committed: Some(3),
            end: 7,
        };
        assert_eq!(behind.lag(), 4);
    }
}
