//! A subscriber whose subscriptions count the time spent in `poll` and in `commit`, so the
//! consume bench can say how a drain's time splits between the broker and the consumer's
//! transactions, and note when the group first handed out partitions (a Kafka group takes
//! seconds to form; the drain is measured from then on).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega_core::{Record, Subscriber, Subscription, TransportError};

/// Microseconds spent in the broker's calls, summed over every subscription.
#[derive(Debug, Default)]
pub(crate) struct BrokerTime {
    /// In `poll` (waiting for and fetching records).
    pub(crate) poll_us: AtomicU64,
    /// In `commit` (offsets acknowledged by the broker).
    pub(crate) commit_us: AtomicU64,
    /// When a poll first returned holding partitions; polls until then are not counted.
    pub(crate) joined: OnceLock<Instant>,
}

fn add(total: &AtomicU64, since: Instant) {
    let us = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
    total.fetch_add(us, Ordering::Relaxed);
}

/// Wraps a subscriber; every subscription it makes adds to one [`BrokerTime`].
pub(crate) struct TimedSubscriber {
    inner: Arc<dyn Subscriber>,
    time: Arc<BrokerTime>,
}

impl TimedSubscriber {
    /// `inner`, timed into `time`.
    pub(crate) fn new(inner: Arc<dyn Subscriber>, time: Arc<BrokerTime>) -> Self {
        Self { inner, time }
    }
}

#[async_trait]
impl Subscriber for TimedSubscriber {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        let inner = self.inner.subscribe(group, topic, member).await?;
        Ok(Box::new(Timed {
            inner,
            time: Arc::clone(&self.time),
        }))
    }
}

struct Timed {
    inner: Box<dyn Subscription>,
    time: Arc<BrokerTime>,
}

#[async_trait]
impl Subscription for Timed {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        let started = Instant::now();
        let result = self.inner.poll(max, wait).await;
        if self.time.joined.get().is_some() {
            add(&self.time.poll_us, started);
        } else if !self.inner.assignment().is_empty() {
            let _ = self.time.joined.set(Instant::now());
        }
        result
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        let started = Instant::now();
        let result = self.inner.commit(offsets).await;
        add(&self.time.commit_us, started);
        result
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        self.inner.seek(partition, offset);
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        self.inner.pause_for(partition, until);
    }

    fn assignment(&self) -> Vec<u32> {
        self.inner.assignment()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        self.inner.close().await
    }
}
