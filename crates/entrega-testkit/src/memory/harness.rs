//! The conformance harness for the in-memory implementations.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    Clock, DlqStore, LaneLeases, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
    ParkingStore, Publisher, Record, Subscriber, SystemClock, TopicAdmin,
};
use uuid::Uuid;

use super::{MemoryDlqStore, MemoryInbox, MemoryLog, MemoryOutbox, MemoryParking, MemoryTx};
use crate::harness::{
    BoxError, DlqFixture, DlqHarness, HeldTx, InboxFixture, InboxHarness, LogFixture, LogHarness,
    LogSettings, OutboxFixture, OutboxHarness, ParkingFixture, ParkingHarness, RowState, TxEnd,
};

/// Runs the conformance suites against [`MemoryOutbox`], [`MemoryInbox`] and [`MemoryLog`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryHarness;

#[async_trait]
impl OutboxHarness for MemoryHarness {
    async fn outbox(&self, clock: Arc<dyn Clock>) -> Result<Box<dyn OutboxFixture>, BoxError> {
        Ok(Box::new(MemoryOutbox::with_clock(clock)))
    }
}

#[async_trait]
impl OutboxFixture for MemoryOutbox {
    fn leases(&self) -> Arc<dyn LaneLeases> {
        Arc::new(self.clone())
    }
    fn reader(&self) -> Arc<dyn OutboxReader> {
        Arc::new(self.clone())
    }
    fn maintenance(&self) -> Arc<dyn OutboxMaintenance> {
        Arc::new(self.clone())
    }
    fn wakeup(&self) -> Arc<dyn OutboxWakeup> {
        Arc::new(self.clone())
    }

    async fn enqueue(&self, events: &[NewEvent], end: TxEnd) -> Result<(), BoxError> {
        let tx = self.begin(events);
        if end == TxEnd::Commit {
            tx.commit();
        }
        Ok(())
    }

    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError> {
        Ok(Box::new(self.begin(events)))
    }

    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError> {
        Ok(self.row_state(id).map(|(lane, seq, published)| RowState {
            lane,
            seq,
            published,
        }))
    }

    async fn row_count(&self) -> Result<u64, BoxError> {
        Ok(self.len() as u64)
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        Ok(())
    }
}

#[async_trait]
impl HeldTx for MemoryTx {
    async fn commit(self: Box<Self>) -> Result<(), BoxError> {
        MemoryTx::commit(*self);
        Ok(())
    }
}

#[async_trait]
impl InboxHarness for MemoryHarness {
    async fn inbox(&self) -> Result<Box<dyn InboxFixture>, BoxError> {
        Ok(Box::new(MemoryInbox::with_clock(Arc::new(SystemClock))))
    }
}

#[async_trait]
impl InboxFixture for MemoryInbox {
    async fn claim(&self, consumer: &str, message_id: &str, end: TxEnd) -> Result<bool, BoxError> {
        Ok(match end {
            TxEnd::Commit => MemoryInbox::claim(self, consumer, message_id),
            // A rolled-back claim answers as the insert would have, then leaves no trace.
            TxEnd::Rollback => !self.contains(consumer, message_id),
        })
    }

    async fn count(&self, consumer: &str) -> Result<u64, BoxError> {
        Ok(MemoryInbox::count(self, consumer))
    }

    async fn purge_older_than(&self, age: Duration) -> Result<u64, BoxError> {
        Ok(MemoryInbox::purge_older_than(self, age))
    }

    async fn backdate(
        &self,
        consumer: &str,
        message_id: &str,
        age: Duration,
    ) -> Result<(), BoxError> {
        MemoryInbox::backdate(self, consumer, message_id, age);
        Ok(())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        Ok(())
    }
}

#[async_trait]
impl ParkingHarness for MemoryHarness {
    async fn parking(&self) -> Result<Box<dyn ParkingFixture>, BoxError> {
        Ok(Box::new(MemoryParkingFixture(Arc::new(
            MemoryParking::new(),
        ))))
    }
}

/// A [`MemoryParking`] as a conformance fixture.
struct MemoryParkingFixture(Arc<MemoryParking>);

#[async_trait]
impl ParkingFixture for MemoryParkingFixture {
    fn store(&self) -> Arc<dyn ParkingStore> {
        self.0.clone()
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        Ok(())
    }
}

#[async_trait]
impl LogHarness for MemoryHarness {
    async fn log(
        &self,
        settings: LogSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Box<dyn LogFixture>, BoxError> {
        Ok(Box::new(MemoryLog::with_settings(settings, clock)))
    }
}

#[async_trait]
impl LogFixture for MemoryLog {
    fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.clone())
    }
    fn admin(&self) -> Arc<dyn TopicAdmin> {
        Arc::new(self.clone())
    }
    fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(self.clone())
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, BoxError> {
        Ok(MemoryLog::committed(self, group, topic))
    }

    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, BoxError> {
        Ok(MemoryLog::end_offsets(self, topic))
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, BoxError> {
        Ok(MemoryLog::read(self, topic, partition, from, max))
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        Ok(())
    }
}

#[async_trait]
impl DlqHarness for MemoryHarness {
    async fn dlq(&self) -> Result<Box<dyn DlqFixture>, BoxError> {
        Ok(Box::new(MemoryDlqStore::new()))
    }
}

#[async_trait]
impl DlqFixture for MemoryDlqStore {
    fn store(&self) -> Arc<dyn DlqStore> {
        Arc::new(self.clone())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        Ok(())
    }
}
