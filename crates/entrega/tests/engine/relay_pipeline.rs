//! The relay's rounds overlap: a round's publish runs while the round before is marked and the
//! round after is read. Order and at-least-once hold as with rounds one after another, also
//! when a publish fails in the middle of a drain.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::Relay;
use entrega_core::{
    lane_of, now_ms, Envelope, LaneCursor, LaneLease, LaneMark, LaneRows, ManualClock, NewEvent,
    OutboxReader, OutboxRow, OutgoingMessage, Publisher, StoreError, TransportError,
};
use entrega_testkit::TxEnd;
use support::relay_steps::{config, env_with_topic, events, published, TOPIC};
use support::{all_records, Env, BACKENDS};
use uuid::Uuid;

/// Publishes through `inner`, slowly, failing the publish calls numbered in `fail_calls`
/// (from 1); notes whether a publish is in flight.
struct SlowPublisher {
    inner: Arc<dyn Publisher>,
    delay: Duration,
    calls: AtomicUsize,
    fail_calls: Vec<usize>,
    in_flight: Arc<AtomicBool>,
}

#[async_trait]
impl Publisher for SlowPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight.store(true, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let result = if self.fail_calls.contains(&call) {
            Err(TransportError::unavailable(std::io::Error::other(
                "broker went away",
            )))
        } else {
            self.inner.publish(batch).await
        };
        self.in_flight.store(false, Ordering::SeqCst);
        result
    }
}

/// Counts the reads past a cursor, and how many of them started while a publish was in flight.
struct WatchingReader {
    inner: Arc<dyn OutboxReader>,
    in_flight: Arc<AtomicBool>,
    reads_after: AtomicUsize,
    overlapped: AtomicUsize,
}

#[async_trait]
impl OutboxReader for WatchingReader {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
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
        refusal: &entrega_core::Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.inner.record_refusal(lease, refusal, now_ms).await
    }

    async fn pending_lanes(
        &self,
        lanes: &[u32],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        self.inner.pending_lanes(lanes, limit).await
    }

    async fn pending_lanes_after(
        &self,
        cursors: &[LaneCursor],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        self.reads_after.fetch_add(1, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) {
            self.overlapped.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.pending_lanes_after(cursors, limit).await
    }

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        self.inner.mark_published_lanes(marks, now_ms).await
    }
}

struct Rig {
    env: Env,
    relay: Relay,
    reader: Arc<WatchingReader>,
    publisher: Arc<SlowPublisher>,
    clock: ManualClock,
}

async fn rig(backend: support::Backend, fail_calls: Vec<usize>) -> Rig {
    let clock = ManualClock::new(now_ms());
    let env = env_with_topic(backend, Arc::new(clock.clone())).await;
    let in_flight = Arc::new(AtomicBool::new(false));
    let publisher = Arc::new(SlowPublisher {
        inner: env.log.publisher(),
        delay: Duration::from_millis(30),
        calls: AtomicUsize::new(0),
        fail_calls,
        in_flight: in_flight.clone(),
    });
    let mut ports = env.ports();
    let reader = Arc::new(WatchingReader {
        inner: ports.reader.clone(),
        in_flight,
        reads_after: AtomicUsize::new(0),
        overlapped: AtomicUsize::new(0),
    });
    ports.reader = reader.clone();
    let relay = Relay::new(
        ports,
        publisher.clone(),
        Arc::new(clock.clone()),
        config("r1"),
    );
    Rig {
        env,
        relay,
        reader,
        publisher,
        clock,
    }
}

/// Three aggregates on three different lanes, seven events each: four rounds of batches of
/// two.
fn workload() -> Vec<NewEvent> {
    let mut lanes = Vec::new();
    let mut ids = Vec::new();
    for n in 0.. {
        let id = format!("P-{n}");
        if !lanes.contains(&lane_of(&id)) {
            lanes.push(lane_of(&id));
            ids.push(id);
            if ids.len() == 3 {
                break;
            }
        }
    }
    ids.iter().flat_map(|id| events(id, 0..7)).collect()
}

/// Per aggregate, the `n` of its events in the order they first reached the topic, and how
/// many records the topic holds.
async fn first_appearances(env: &Env) -> (HashMap<String, Vec<u64>>, usize) {
    let records = all_records(env.log.as_ref(), TOPIC).await;
    let mut seen = std::collections::HashSet::new();
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    for r in &records {
        let envelope = Envelope::parse(&r.payload).unwrap();
        if seen.insert(envelope.id) {
            order
                .entry(r.key.clone().unwrap())
                .or_default()
                .push(envelope.data["n"].as_u64().unwrap());
        }
    }
    (order, records.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_round_is_read_while_a_publish_is_in_flight() {
    for backend in BACKENDS {
        let rig = rig(backend, Vec::new()).await;
        let all = workload();
        rig.env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        assert_eq!(
            rig.relay.drain_once().await.unwrap(),
            all.len(),
            "{backend:?}"
        );
        assert_eq!(published(rig.env.outbox.as_ref(), &all).await, all.len());
        // Rounds 2, 3 and 4 were read past the rows of the round before, each during that
        // round's publish; a last read after round 4 found nothing.
        let reads = rig.reader.reads_after.load(Ordering::SeqCst);
        let overlapped = rig.reader.overlapped.load(Ordering::SeqCst);
        assert!(reads >= 3, "{backend:?}: {reads} reads past a cursor");
        assert_eq!(overlapped, reads, "{backend:?}: reads outside a publish");
        assert_eq!(rig.publisher.calls.load(Ordering::SeqCst), 4);
        let (order, records) = first_appearances(&rig.env).await;
        assert_eq!(
            records,
            all.len(),
            "{backend:?}: duplicates without a failure"
        );
        for (key, ns) in order {
            assert_eq!(ns, (0..7).collect::<Vec<u64>>(), "{backend:?}: {key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_mid_drain_marks_only_what_was_confirmed() {
    for backend in BACKENDS {
        // The second round's publish fails, while the first is being marked and the third
        // read.
        let rig = rig(backend, vec![2]).await;
        let all = workload();
        rig.env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let first = rig.relay.drain_once().await.unwrap();
        assert_eq!(
            first, 6,
            "{backend:?}: the first round, two of each aggregate"
        );
        assert_eq!(published(rig.env.outbox.as_ref(), &all).await, 6);
        let (_, records) = first_appearances(&rig.env).await;
        assert_eq!(
            records, 6,
            "{backend:?}: nothing of the failed round reached the topic"
        );

        // After the backoff the lanes go alone and finish; nothing lost, order kept.
        rig.clock.advance(1_000);
        let mut rest = 0;
        for _ in 0..10 {
            rest += rig.relay.drain_once().await.unwrap();
            if rest == all.len() - first {
                break;
            }
            rig.clock.advance(1_000);
        }
        assert_eq!(rest, all.len() - first, "{backend:?}");
        assert_eq!(published(rig.env.outbox.as_ref(), &all).await, all.len());
        let (order, _) = first_appearances(&rig.env).await;
        for (key, ns) in order {
            assert_eq!(ns, (0..7).collect::<Vec<u64>>(), "{backend:?}: {key}");
        }
    }
}
