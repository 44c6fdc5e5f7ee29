//! Waiting for a condition with a bounded deadline, instead of sleeping a guessed time.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`wait_until`] re-checks its condition.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);

/// Re-checks `condition` until it holds or `deadline` passes; returns whether it held.
/// Tests assert on the result, so a condition that never holds fails instead of hanging.
pub async fn wait_until<F, Fut>(deadline: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// A failed check inside a scenario, carrying what was expected.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CheckFailed(pub String);

/// Returns `Err(CheckFailed)` from the enclosing scenario unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::BoxError::from($crate::CheckFailed(format!($($msg)+))));
        }
    };
}
