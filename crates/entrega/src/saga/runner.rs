//! The orchestrator at work: replies through a [`Worker`](crate::Worker) (a [`Sagas`] is a
//! [`Handler`]), timers through [`Sagas::run_timers`].

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::HandlerError;
use tokio_util::sync::CancellationToken;

use super::engine::Sagas;
use super::error::SagaError;
use crate::{Handler, Message};

/// Sagas whose timers fire in one round, each in its own transaction.
const TIMERS_PER_ROUND: usize = 64;

#[async_trait]
impl Handler for Sagas {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        match Sagas::handle(self, &msg.envelope).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_transient() => Err(HandlerError::transient(e)),
            Err(e) => Err(HandlerError::permanent(e)),
        }
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        self.handle_all(msgs).await
    }
}

impl Sagas {
    /// Fires timers until `shutdown`: every round handles what is due, then sleeps until the
    /// soonest timer or `every`, whichever comes first (a timer set by another process is
    /// seen within `every`). A failing database is logged and tried again next round.
    pub async fn run_timers(
        &self,
        every: Duration,
        shutdown: CancellationToken,
    ) -> Result<(), SagaError> {
        loop {
            let wait = match self.timer_round().await {
                Ok(Some(wait)) => wait.min(every),
                Ok(None) => every,
                Err(e) if e.is_transient() => {
                    tracing::warn!(kind = self.kind(), error = %e, "saga timers: will try again");
                    every
                }
                Err(e) => return Err(e),
            };
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One round of timers: how long until the next one, if any is set.
    async fn timer_round(&self) -> Result<Option<Duration>, SagaError> {
        while self.tick(TIMERS_PER_ROUND).await? == TIMERS_PER_ROUND {}
        let Some(at) = self.next_due().await? else {
            return Ok(None);
        };
        let now = self.clock_ms();
        let ms = u64::try_from(at.saturating_sub(now)).unwrap_or(0);
        Ok(Some(Duration::from_millis(ms.max(1))))
    }
}
