//! The relay drains its lanes together, in rounds: one read for every lane however many it
//! holds, and a row the transport refuses holds back only its own lane.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega::Relay;
use entrega_core::{
    lane_of, now_ms, LaneLease, LaneMark, LaneRows, ManualClock, OutboxReader, OutboxRow,
    OutgoingMessage, Publisher, Refusal, StoreError, TransportError,
};
use entrega_testkit::TxEnd;
use support::relay_steps::{config, env_with_topic, events, published};
use support::BACKENDS;
use uuid::Uuid;

/// Refuses, for good, any batch holding a message with the poisoned key.
struct RefuseKey {
    inner: Arc<dyn Publisher>,
    key: String,
}

#[async_trait]
impl Publisher for RefuseKey {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if batch
            .iter()
            .any(|m| m.key.as_deref() == Some(&self.key[..]))
        {
            return Err(TransportError::Rejected {
                reason: "message too large".into(),
            });
        }
        self.inner.publish(batch).await
    }
}

/// Aggregate ids whose lanes differ from each other and from `avoid`'s.
fn aggregates_on_other_lanes(avoid: &str, count: usize) -> Vec<String> {
    let mut lanes = vec![lane_of(avoid)];
    let mut out = Vec::new();
    for n in 0.. {
        let id = format!("P-{n}");
        if !lanes.contains(&lane_of(&id)) {
            lanes.push(lane_of(&id));
            out.push(id);
            if out.len() == count {
                break;
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_holds_back_only_its_own_lane() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let poison = events("P-poison", 0..2);
        let others: Vec<_> = aggregates_on_other_lanes("P-poison", 4)
            .iter()
            .flat_map(|id| events(id, 0..3))
            .collect();
        env.outbox
            .enqueue(&[poison.clone(), others.clone()].concat(), TxEnd::Commit)
            .await
            .unwrap();
        let refuse = Arc::new(RefuseKey {
            inner: env.log.publisher(),
            key: "P-poison".into(),
        });
        let relay = Relay::new(env.ports(), refuse, Arc::new(clock.clone()), config("r1"));
        // The first round carries the poisoned row, so it fails as a whole and marks nothing.
        assert_eq!(relay.drain_once().await.unwrap(), 0, "{backend:?}");
        assert_eq!(published(env.outbox.as_ref(), &others).await, 0);

        // After the first backoff every lane goes alone: the healthy ones get through.
        clock.advance(1_000);
        assert_eq!(
            relay.drain_once().await.unwrap(),
            others.len(),
            "{backend:?}"
        );
        assert_eq!(published(env.outbox.as_ref(), &others).await, others.len());
        assert_eq!(published(env.outbox.as_ref(), &poison).await, 0);

        // Healthy lanes are back in rounds while the poisoned lane keeps backing off.
        let later = events(&aggregates_on_other_lanes("P-poison", 1)[0], 3..5);
        env.outbox.enqueue(&later, TxEnd::Commit).await.unwrap();
        assert_eq!(relay.drain_once().await.unwrap(), later.len());
        assert_eq!(published(env.outbox.as_ref(), &poison).await, 0);
    }
}

/// Counts the reads a relay makes.
struct CountingReader {
    inner: Arc<dyn OutboxReader>,
    single: AtomicUsize,
    many: AtomicUsize,
}

#[async_trait]
impl OutboxReader for CountingReader {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.single.fetch_add(1, Ordering::SeqCst);
        self.inner.pending(lane, limit).await
    }

    async fn mark_published(
        &self,
        lease: &LaneLease,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.inner.mark_published(lease, ids, now_ms).await
    }

    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.inner.record_refusal(lease, refusal, now_ms).await
    }

    async fn pending_lanes(
        &self,
        lanes: &[u32],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        self.many.fetch_add(1, Ordering::SeqCst);
        self.inner.pending_lanes(lanes, limit).await
    }

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        self.inner.mark_published_lanes(marks, now_ms).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_reads_every_held_lane_at_once() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let all: Vec<_> = aggregates_on_other_lanes("P-x", 3)
            .iter()
            .flat_map(|id| events(id, 0..1))
            .collect();
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let mut ports = env.ports();
        let reader = Arc::new(CountingReader {
            inner: ports.reader.clone(),
            single: AtomicUsize::new(0),
            many: AtomicUsize::new(0),
        });
        ports.reader = reader.clone();
        let relay = Relay::new(
            ports,
            env.log.publisher(),
            Arc::new(clock.clone()),
            config("r1"),
        );
        assert_eq!(relay.drain_once().await.unwrap(), 3, "{backend:?}");
        assert_eq!(relay.lanes().await.len(), 64);
        assert_eq!(published(env.outbox.as_ref(), &all).await, 3);
        // An idle pass over 64 lanes is one read too.
        assert_eq!(relay.drain_once().await.unwrap(), 0);
        assert_eq!(
            (
                reader.many.load(Ordering::SeqCst),
                reader.single.load(Ordering::SeqCst)
            ),
            (2, 0),
            "{backend:?}: reads per pass"
        );
    }
}
