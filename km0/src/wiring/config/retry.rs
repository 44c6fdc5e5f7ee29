//! How km0's consumers retry: the strategy and the policy (`--retry`, `--max-attempts`,
//! `--retry-base-ms`, `--retry-max-ms`, `--retry-jitter`), applied to each subscription.

use std::time::Duration;

use clap::{Args, ValueEnum};
use entrega::{Backoff, RetryStrategy, WorkerConfig};

/// Where a message that failed transiently waits for its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum RetryMode {
    /// The partition rewinds and pauses: strict order, later messages of the partition wait.
    #[default]
    InPlace,
    /// The seed's `<topic>.retry`: the partition goes on; a retried message loses its place.
    RetryTopic,
    /// The failing key is parked with its later messages; other keys go on, each key in order.
    Ordered,
    /// RabbitMQ's TTL wait queues: the message waits in the broker and comes back into the
    /// group's queue with `intentos`; the queue goes on, a retried message loses its place.
    DelayQueues,
}

/// The retry flags, shared by every consumer of the process.
#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
    /// Where a message that failed transiently waits for its next attempt.
    #[arg(
        long = "retry",
        global = true,
        env = "KM0_RETRY",
        value_enum,
        default_value_t
    )]
    pub mode: RetryMode,
    /// Attempts of a transiently failing message before it is dead-lettered.
    #[arg(
        long,
        global = true,
        env = "KM0_MAX_ATTEMPTS",
        default_value_t = 3,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_attempts: u32,
    /// Delay after the first failure, in milliseconds; doubles with each attempt.
    #[arg(long, global = true, env = "KM0_RETRY_BASE_MS", default_value_t = 1000)]
    pub retry_base_ms: u64,
    /// Largest delay between attempts, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "KM0_RETRY_MAX_MS",
        default_value_t = 60_000
    )]
    pub retry_max_ms: u64,
    /// Largest fraction (0 to 1) taken off a delay at random.
    #[arg(long, global = true, env = "KM0_RETRY_JITTER", default_value_t = 0.2)]
    pub retry_jitter: f64,
}

impl Default for RetryArgs {
    fn default() -> Self {
        Self {
            mode: RetryMode::InPlace,
            max_attempts: 3,
            retry_base_ms: 1000,
            retry_max_ms: 60_000,
            retry_jitter: 0.2,
        }
    }
}

impl RetryArgs {
    /// The engine's strategy for [`RetryArgs::mode`].
    pub fn strategy(&self) -> RetryStrategy {
        match self.mode {
            RetryMode::InPlace => RetryStrategy::InPlace,
            RetryMode::RetryTopic => RetryStrategy::RetryTopic,
            RetryMode::Ordered => RetryStrategy::Ordered,
            RetryMode::DelayQueues => RetryStrategy::DelayQueues,
        }
    }

    /// Applies strategy, attempts and backoff to one subscription's settings.
    pub fn apply(&self, config: &mut WorkerConfig) {
        config.retry = self.strategy();
        config.max_attempts = self.max_attempts.max(1);
        let base = Duration::from_millis(self.retry_base_ms);
        let max = Duration::from_millis(self.retry_max_ms.max(self.retry_base_ms));
        config.backoff = Backoff::new(base, max).with_jitter(self.retry_jitter);
    }
}
