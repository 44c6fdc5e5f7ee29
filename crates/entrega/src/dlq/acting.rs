//! One replay or discard at a time, per dead-letter store: the action lock an action holds
//! from reading its selection to recording its marks, so two confirmations of the same
//! selection never both publish it (the second reads the first's marks, and its count or
//! selection no longer matches). Given back when the action ends, refused or done; kept
//! until its lease ends by an action cancelled midway.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::DlqStore;

use super::error::DlqError;
use super::DeadLetters;

/// Longest an action holds the lock unless it finishes: a process that died holding it is
/// passed over after this.
pub const ACTION_LEASE: Duration = Duration::from_secs(300);
/// How long an action waits for another to finish before it answers [`DlqError::Busy`].
pub const WAIT_FOR_ACTION: Duration = Duration::from_secs(10);
/// How often a waiting action tries again.
const TRY_EVERY: Duration = Duration::from_millis(100);

/// The action lock while held, given back by [`Acting::release`]. An action cancelled
/// midway (its future dropped, its process killed) keeps it until its lease ends: what it
/// published may not be marked yet, and another action must not read those letters as pending
/// meanwhile.
pub(super) struct Acting {
    store: Arc<dyn DlqStore>,
    holder: Option<String>,
}

impl Acting {
    /// Gives the lock back. A failure is logged, not returned: the action is done, and the
    /// lock passes when its lease ends.
    pub(super) async fn release(mut self) {
        if let Some(holder) = self.holder.take() {
            if let Err(e) = self.store.unlock_actions(&holder).await {
                tracing::warn!(
                    error = %e,
                    "giving the dead-letter action lock back failed; it passes when its lease ends"
                );
            }
        }
    }
}

impl DeadLetters {
    /// Runs `action` holding the action lock (waited for up to [`WAIT_FOR_ACTION`]), and
    /// gives it back whatever the action's outcome; a dry run, which changes nothing, holds
    /// nothing.
    pub(super) async fn exclusively<T>(
        &self,
        dry_run: bool,
        action: impl std::future::Future<Output = Result<T, DlqError>>,
    ) -> Result<T, DlqError> {
        let acting = self.take_lock(dry_run).await?;
        let outcome = action.await;
        acting.release().await;
        outcome
    }

    /// The action lock, waited for up to [`WAIT_FOR_ACTION`]; nothing for a dry run.
    async fn take_lock(&self, dry_run: bool) -> Result<Acting, DlqError> {
        let mut acting = Acting {
            store: Arc::clone(&self.store),
            holder: None,
        };
        if dry_run {
            return Ok(acting);
        }
        let holder = uuid::Uuid::new_v4().to_string();
        let lease_ms = i64::try_from(ACTION_LEASE.as_millis()).unwrap_or(i64::MAX);
        let deadline = tokio::time::Instant::now() + WAIT_FOR_ACTION;
        loop {
            let now = self.clock.now_ms();
            if self
                .store
                .lock_actions(&holder, now, now.saturating_add(lease_ms))
                .await?
            {
                acting.holder = Some(holder);
                return Ok(acting);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(DlqError::Busy);
            }
            tokio::time::sleep(TRY_EVERY).await;
        }
    }
}
