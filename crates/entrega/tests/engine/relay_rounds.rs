//! The relay drains its lanes together, in rounds: one read for every lane however many it
//! holds. (Rows the transport refuses: `relay_refused.rs`.)
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega::Relay;
use entrega_core::{
    lane_of, now_ms, LaneLease, LaneMark, LaneRows, ManualClock, OutboxReader, OutboxRow, Refusal,
    StoreError,
};
use entrega_testkit::TxEnd;
use support::relay_steps::{config, env_with_topic, events, published};
use support::BACKENDS;
use uuid::Uuid;

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
