//! One replay or discard at a time, per dead-letter store: the action lock an action holds
//! from reading its selection to recording its marks, so two confirmations of the same
//! selection never both publish it (the second reads the first's marks, and its count or
//! selection no longer matches).

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

/// The action lock while held; given back by [`Acting::release`], or when dropped.
pub(super) struct Acting {
    store: Arc<dyn DlqStore>,
    holder: Option<String>,
}

impl Acting {
    /// Gives the lock back.
    pub(super) async fn release(mut self) -> Result<(), DlqError> {
        if let Some(holder) = self.holder.take() {
            self.store.unlock_actions(&holder).await?;
        }
        Ok(())
    }
}

impl Drop for Acting {
    /// An action that stopped early (refused, failed) gives the lock back in the background.
    fn drop(&mut self) {
        if let (Some(holder), Ok(runtime)) =
            (self.holder.take(), tokio::runtime::Handle::try_current())
        {
            let store = Arc::clone(&self.store);
            runtime.spawn(async move {
                if let Err(e) = store.unlock_actions(&holder).await {
                    tracing::warn!(error = %e, "giving the dead-letter action lock back failed; \
                                   it passes when its lease ends");
                }
            });
        }
    }
}

impl DeadLetters {
    /// The action lock, waited for up to [`WAIT_FOR_ACTION`]; nothing to hold for a dry run,
    /// which changes nothing.
    pub(super) async fn exclusively(&self, dry_run: bool) -> Result<Acting, DlqError> {
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
