//! The producer side of `km0 bench e2e`: orders committed at a fixed rate, each in its own task
//! scheduled by its intended start (a slow system does not slow the arrivals down), and the
//! instants the bench measures between: commits, and the consumer's completions.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use super::workload::order;
use crate::services::pedidos::OrderStore;

/// Commit and completion times per event id, in epoch microseconds (comparable with the
/// broker's record timestamps); the first completion counts.
pub(crate) type Instants = Arc<Mutex<HashMap<Uuid, i64>>>;

/// Now, in epoch microseconds.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Notes that `id` got somewhere at `at`, unless it got there before.
pub(crate) fn record(map: &Instants, id: Uuid, at: i64) {
    let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
    map.entry(id).or_insert(at);
}

/// Commits orders through `store` and remembers what happened to them.
pub(crate) struct Producer {
    store: OrderStore,
    run_tag: String,
    interval: Duration,
    /// When each order's commit returned, by event id.
    pub(crate) committed: Instants,
    /// How long each measured order took from its intended start to its commit, in µs.
    pub(crate) commit: Histogram<u64>,
    /// Events of the warm-up, not measured.
    pub(crate) warm: HashSet<Uuid>,
}

impl Producer {
    /// A producer of `rate` orders per second through `store`.
    pub(crate) fn new(store: OrderStore, rate: u32) -> anyhow::Result<Self> {
        Ok(Self {
            store,
            run_tag: Uuid::new_v4().simple().to_string()[..8].to_owned(),
            interval: Duration::from_secs_f64(1.0 / f64::from(rate.max(1))),
            committed: Arc::default(),
            commit: Histogram::new_with_bounds(1, 3_600_000_000, 3)?,
            warm: HashSet::new(),
        })
    }

    /// Commits orders number `range` at the rate from now on, the warm-up ones (`warm`) not
    /// measured; returns once every commit has returned, with the seconds the arrivals took.
    pub(crate) async fn arrive(&mut self, range: Range<usize>, warm: bool) -> anyhow::Result<f64> {
        let mut arrivals = JoinSet::new();
        let start = Instant::now();
        for (k, i) in range.enumerate() {
            let intended = start + self.interval.mul_f64(k as f64);
            tokio::time::sleep_until(intended).await;
            let (store, committed) = (self.store.clone(), Arc::clone(&self.committed));
            let order = order(format!("E-{}-{i:07}", self.run_tag), i);
            arrivals.spawn(async move {
                let id = store.create(&order, None).await?;
                record(&committed, id, now_us());
                Ok::<_, anyhow::Error>((id, intended.elapsed()))
            });
            // Collect finished arrivals as we go, so the set stays small.
            while let Some(done) = arrivals.try_join_next() {
                self.note(done, warm)?;
            }
        }
        while let Some(done) = arrivals.join_next().await {
            self.note(done, warm)?;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    fn note(
        &mut self,
        done: Result<anyhow::Result<(Uuid, Duration)>, tokio::task::JoinError>,
        warm: bool,
    ) -> anyhow::Result<()> {
        let (id, took) = done
            .context("producer task")?
            .context("committing an order")?;
        if warm {
            self.warm.insert(id);
        } else {
            self.commit
                .saturating_record(u64::try_from(took.as_micros())?.max(1));
        }
        Ok(())
    }

    /// Every event committed so far, with its commit time.
    pub(crate) fn events(&self) -> Vec<(Uuid, i64)> {
        let map = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.iter().map(|(id, at)| (*id, *at)).collect()
    }
}

/// Waits until every event committed so far has been consumed, failing after `limit` or once
/// `stopped` says the relay or the worker has stopped.
pub(crate) async fn all_consumed(
    producer: &Producer,
    consumed: &Instants,
    limit: Duration,
    stopped: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let ids = producer.events();
    let deadline = Instant::now() + limit;
    loop {
        let done = {
            let map = consumed.lock().unwrap_or_else(PoisonError::into_inner);
            ids.iter().all(|(id, _)| map.contains_key(id))
        };
        if done {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("not every order was consumed within {limit:?}");
        }
        if stopped() {
            bail!("the relay or the worker stopped");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
