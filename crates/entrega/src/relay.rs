//! The outbox relay: publishes pending outbox rows and marks them published only after the
//! transport confirmed them.
//!
//! Lanes are shared among relay instances through fenced leases (`LaneLeases::balance`), so
//! each lane, and with it each aggregate, is published by one instance at a time in insertion
//! order. The lanes an instance holds are drained together, in rounds: one read of every
//! lane's oldest rows, one publish, one fenced mark, with one round's publish overlapping the
//! marking of the round before and the reading of the round after (see `rounds`). A publish
//! that fails for a transient reason (broker down) leaves its rows pending (they go out again,
//! same `id_evento`, which idempotent consumers absorb) and its lanes back off, then go alone
//! until they succeed. A publish the transport refuses for good (too large, unknown topic) is
//! narrowed down to the rows it refuses (see `isolate`): each gets its attempts, next attempt
//! time and last error recorded, and is held at `max_attempts`; only its aggregate waits
//! behind it, the rest of the lane goes on. A lost lease drops the lane before anything of it
//! is marked.

mod drain;
mod isolate;
mod rounds;
pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use entrega_core::{Clock, Holder, LaneLease, Publisher, StoreError};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::relay_config::{bump, millis, OutboxPorts, RelayConfig, RelayStats};
use drain::LaneError;

/// Why a relay step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The outbox store failed (balancing lanes, releasing them at shutdown).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Consecutive failures of one lane and when it may be tried again.
#[derive(Debug, Clone, Copy)]
struct LaneBackoff {
    failures: u32,
    not_before_ms: i64,
}

#[derive(Debug, Default)]
struct State {
    leases: Vec<LaneLease>,
    balanced_at_ms: Option<i64>,
    rebalance: bool,
    backoff: HashMap<u32, LaneBackoff>,
    purged_at_ms: Option<i64>,
}

/// Publishes the outbox. One value per relay instance; see the module docs.
pub struct Relay {
    ports: OutboxPorts,
    publisher: Arc<dyn Publisher>,
    clock: Arc<dyn Clock>,
    config: RelayConfig,
    /// `config.instance_id` in this relay's life: a relay started again under the same name
    /// takes its lanes back at once, fencing this one out.
    holder: Holder,
    stats: Arc<RelayStats>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay publishing the outbox behind `ports` through `publisher`.
    pub fn new(
        ports: OutboxPorts,
        publisher: Arc<dyn Publisher>,
        clock: Arc<dyn Clock>,
        config: RelayConfig,
    ) -> Self {
        let holder = Holder::new(config.instance_id.clone(), clock.now_ms());
        Self {
            ports,
            publisher,
            clock,
            config,
            holder,
            stats: Arc::default(),
            state: Mutex::default(),
        }
    }

    /// The relay's counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        Arc::clone(&self.stats)
    }

    /// The relay's settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Lanes held after the last balancing.
    pub async fn lanes(&self) -> Vec<u32> {
        self.state
            .lock()
            .await
            .leases
            .iter()
            .map(|l| l.lane)
            .collect()
    }

    /// One pass: balances lanes when due, then drains every held lane that is not backing
    /// off, and purges when due. Returns how many events were published and marked.
    /// Failures of single lanes are counted and backed off, not returned; only a failure to
    /// balance is an error.
    pub async fn drain_once(&self) -> Result<usize, RelayError> {
        let mut state = self.state.lock().await;
        self.balance_if_due(&mut state).await?;
        let mut published = 0;
        let now = self.clock.now_ms();
        // Lanes that failed before go alone once their backoff ends; the rest go in rounds.
        let mut together = Vec::with_capacity(state.leases.len());
        for lease in state.leases.clone() {
            match state.backoff.get(&lease.lane) {
                None => together.push(lease),
                Some(b) if now < b.not_before_ms => {}
                Some(_) => {
                    let result = self.drain_lane(&lease).await;
                    published += self.settle_lane(&mut state, lease.lane, result);
                }
            }
        }
        if !together.is_empty() {
            let rounds = self.rounds(&together).await;
            published += rounds.published;
            for (lane, error) in rounds.failed {
                self.settle_lane(&mut state, lane, Err(error));
            }
        }
        drop(state);
        self.purge_if_due().await;
        Ok(published)
    }

    /// Applies the outcome of draining one lane: forget its failures, drop it (lease lost),
    /// or back it off. Returns the events it published.
    fn settle_lane(&self, state: &mut State, lane: u32, result: Result<usize, LaneError>) -> usize {
        match result {
            Ok(n) => {
                state.backoff.remove(&lane);
                n
            }
            Err(LaneError::LeaseLost) => {
                tracing::warn!(lane, "relay lane lease lost; rebalancing");
                bump(&self.stats.leases_lost, 1);
                state.leases.retain(|l| l.lane != lane);
                state.rebalance = true;
                0
            }
            Err(e) => {
                let failures = state.backoff.get(&lane).map_or(1, |b| b.failures + 1);
                let delay = self.config.backoff.delay(failures);
                if !matches!(e, LaneError::Round) {
                    tracing::warn!(lane, failures, ?delay, error = %e, "relay lane failed");
                }
                let not_before_ms = self.clock.now_ms().saturating_add(millis(delay));
                state.backoff.insert(
                    lane,
                    LaneBackoff {
                        failures,
                        not_before_ms,
                    },
                );
                0
            }
        }
    }

    async fn balance_if_due(&self, state: &mut State) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        let ttl = millis(self.config.lease_ttl);
        // Renew a third into the lease, and before any held lease gets close to expiring.
        let due = state.rebalance
            || state.balanced_at_ms.is_none_or(|at| now - at >= ttl / 3)
            || state.leases.iter().any(|l| l.expires_at_ms - now < ttl / 2);
        if !due {
            return Ok(());
        }
        let leases = self
            .ports
            .leases
            .balance(&self.holder, now, self.config.lease_ttl)
            .await?;
        state
            .backoff
            .retain(|lane, _| leases.iter().any(|l| l.lane == *lane));
        state.leases = leases;
        state.balanced_at_ms = Some(now);
        state.rebalance = false;
        Ok(())
    }

    async fn purge_if_due(&self) {
        let now = self.clock.now_ms();
        {
            let mut state = self.state.lock().await;
            let interval = millis(self.config.purge_interval);
            if state.purged_at_ms.is_some_and(|at| now - at < interval) {
                return;
            }
            state.purged_at_ms = Some(now);
        }
        let before = now.saturating_sub(millis(self.config.retention));
        match self.ports.maintenance.purge_published(before).await {
            Ok(n) => bump(&self.stats.purged, n),
            Err(e) => tracing::warn!(error = %e, "purging published outbox rows failed"),
        }
    }

    /// Runs until `shutdown` is cancelled: drains, waits for a wake-up (at most the poll
    /// interval) when idle, backs off after failures. On shutdown the current pass finishes
    /// and the lanes are released so other instances take them at once.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RelayError> {
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            let pause = match self.drain_once().await {
                Ok(n) if n > 0 => {
                    failures = 0;
                    continue;
                }
                Ok(_) => {
                    failures = 0;
                    None
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(error = %e, ?delay, "relay pass failed");
                    Some(delay)
                }
            };
            let wait = pause.unwrap_or(self.idle_wait().await);
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = self.ports.wakeup.wait(wait), if pause.is_none() => {}
                () = tokio::time::sleep(wait), if pause.is_some() => {}
            }
        }
        let mut state = self.state.lock().await;
        state.leases.clear();
        match self.ports.leases.release_all(&self.holder).await {
            // The database is away: the lanes go to the others once their leases expire.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "releasing the lanes failed; their leases will expire");
                Ok(())
            }
            released => Ok(released?),
        }
    }

    /// The poll interval, shortened so the next renewal is not missed while idle.
    async fn idle_wait(&self) -> Duration {
        let state = self.state.lock().await;
        let renew_in = state.balanced_at_ms.map_or(0, |at| {
            at + millis(self.config.lease_ttl) / 3 - self.clock.now_ms()
        });
        let renew_in = Duration::from_millis(u64::try_from(renew_in.max(1)).unwrap_or(1));
        self.config.poll_interval.min(renew_in)
    }
}
