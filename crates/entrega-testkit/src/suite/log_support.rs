//! Shared steps of the log scenarios.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use entrega_core::{
    now_ms, partition_for, Headers, ManualClock, OutgoingMessage, Record, Subscription,
};

use crate::harness::{BoxError, LogCapabilities, LogFixture, LogHarness, LogSettings, Scenario};

/// How far the clock moves before each poll: past the heartbeat, so every poll rebalances.
pub(crate) const STEP_MS: i64 = 200;
/// How long one poll may wait for data.
pub(crate) const POLL_WAIT: Duration = Duration::from_millis(50);

pub(crate) type Body<'a> = Pin<Box<dyn Future<Output = Scenario> + Send + 'a>>;

/// The scenario's clock together with the transport's [`LogCapabilities`]; derefs to the clock.
#[derive(Clone)]
pub(crate) struct Pace {
    clock: ManualClock,
    caps: LogCapabilities,
}

impl Pace {
    /// Longest wait of one poll.
    pub(crate) fn poll_wait(&self) -> Duration {
        self.caps.poll_wait
    }

    /// Whether members hold partitions by leases kept under their names.
    pub(crate) fn leases_by_name(&self) -> bool {
        self.caps.leases_by_name
    }

    /// Whether a lone member holds its partitions after one poll.
    pub(crate) fn assigned_on_first_poll(&self) -> bool {
        self.caps.assigned_on_first_poll
    }
}

impl Deref for Pace {
    type Target = ManualClock;

    fn deref(&self) -> &ManualClock {
        &self.clock
    }
}

pub(crate) async fn run<F>(h: &dyn LogHarness, body: F) -> Scenario
where
    F: for<'a> FnOnce(&'a dyn LogFixture, Pace) -> Body<'a>,
{
    let clock = ManualClock::new(now_ms());
    let fx = h
        .log(LogSettings::default(), Arc::new(clock.clone()))
        .await?;
    let pace = Pace {
        clock,
        caps: h.capabilities(),
    };
    let result = body(fx.as_ref(), pace).await;
    if result.is_err() {
        let account = fx.account();
        if !account.is_empty() {
            eprintln!("the transport's account of the failed scenario:");
            for line in account {
                eprintln!("  {line}");
            }
        }
    }
    let teardown = fx.teardown().await;
    result.and(teardown)
}

/// A key that Kafka's placement puts on `partition` of `partitions`.
pub(crate) fn key_for(partition: u32, partitions: u32, salt: &str) -> String {
    (0u32..)
        .map(|i| format!("{salt}-{i}"))
        .find(|k| partition_for(k, partitions) == partition)
        .unwrap_or_default()
}

/// A message with a text payload.
pub(crate) fn message(topic: &str, key: Option<&str>, payload: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: key.map(str::to_owned),
        headers: Headers::new().with("tipo", "prueba.enviada"),
        payload: payload.as_bytes().to_vec(),
    }
}

/// Moves the clock one step and polls once.
pub(crate) async fn step(
    sub: &mut Box<dyn Subscription>,
    clock: &Pace,
) -> Result<Vec<Record>, BoxError> {
    clock.advance(STEP_MS);
    Ok(sub.poll(100, clock.poll_wait()).await?)
}

/// Polls once, or, where joins complete in the background, until the member holds
/// `partitions` partitions (at most 100 polls); returns the records polled meanwhile.
pub(crate) async fn settle(
    sub: &mut Box<dyn Subscription>,
    clock: &Pace,
    partitions: usize,
) -> Result<Vec<Record>, BoxError> {
    let mut got = step(sub, clock).await?;
    if !clock.assigned_on_first_poll() {
        for _ in 0..100 {
            if sub.assignment().len() >= partitions {
                break;
            }
            got.extend(step(sub, clock).await?);
        }
    }
    Ok(got)
}

/// Polls (moving the clock) until `want` records arrived or `rounds` polls were made.
pub(crate) async fn collect(
    sub: &mut Box<dyn Subscription>,
    clock: &Pace,
    want: usize,
    rounds: usize,
) -> Result<Vec<Record>, BoxError> {
    let mut got = Vec::new();
    for _ in 0..rounds {
        got.extend(step(sub, clock).await?);
        if got.len() >= want {
            break;
        }
    }
    Ok(got)
}

/// The next offset to commit for each partition in `records`.
pub(crate) fn next_offsets(records: &[Record]) -> Vec<(u32, i64)> {
    let mut next: BTreeMap<u32, i64> = BTreeMap::new();
    for r in records {
        let e = next.entry(r.partition).or_insert(0);
        *e = (*e).max(r.offset + 1);
    }
    next.into_iter().collect()
}

/// Every record of one partition, read directly.
pub(crate) async fn read_all(
    fx: &dyn LogFixture,
    topic: &str,
    partition: u32,
) -> Result<Vec<Record>, BoxError> {
    let mut out: Vec<Record> = Vec::new();
    loop {
        let batch = fx.read(topic, partition, out.len() as i64, 500).await?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}

/// The payload as text.
pub(crate) fn text(r: &Record) -> String {
    String::from_utf8_lossy(&r.payload).into_owned()
}
