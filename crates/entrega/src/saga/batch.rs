//! A poll's replies applied in one transaction: each still claims its own key, moves its own
//! saga and enqueues its own commands, and they commit together (or, if one fails, are
//! applied one by one).

use entrega_core::{HandlerError, StoreError, TraceContext};

use super::engine::{ReplyOutcome, Sagas};
use super::error::SagaError;
use super::flow::Reply;
use crate::{handle_each, Message};

/// A delivered reply this orchestrator reads.
struct Ours {
    key: String,
    trace: TraceContext,
    reply: Reply,
}

impl Sagas {
    /// Applies the replies among `msgs` in one transaction; messages that are not replies of
    /// this saga type pass, unreadable ones are refused for good. If the transaction fails,
    /// every message is handled on its own ([`Sagas::handle`]), so a failure is retried or
    /// dead-lettered alone.
    pub(crate) async fn handle_all(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        let mut ours = Vec::with_capacity(msgs.len());
        let mut results: Vec<Result<(), HandlerError>> = Vec::with_capacity(msgs.len());
        for msg in msgs {
            match self.flow().reply(&msg.envelope) {
                Ok(Some(reply)) => {
                    ours.push(Ours {
                        key: msg.id(),
                        trace: msg.trace,
                        reply,
                    });
                    results.push(Ok(()));
                }
                Ok(None) => results.push(Ok(())),
                Err(e) => results.push(Err(HandlerError::permanent(SagaError::BadReply(e)))),
            }
        }
        if ours.len() < 2 {
            return handle_each(self, msgs).await;
        }
        match self.apply_all(&ours).await {
            Ok(()) => results,
            Err(e) => {
                tracing::debug!(kind = self.kind(), error = %e, size = ours.len(), "a batch of replies failed whole: applying them one by one");
                handle_each(self, msgs).await
            }
        }
    }

    async fn apply_all(&self, ours: &[Ours]) -> Result<(), SagaError> {
        let keys: Vec<&str> = ours.iter().map(|o| o.key.as_str()).collect();
        let mut batch = self.db().claim_batch(self.consumer(), &keys).await?;
        let mut done = Vec::with_capacity(ours.len());
        let mut duplicates = 0;
        for o in ours {
            if !batch.is_new(&o.key) {
                duplicates += 1;
                continue;
            }
            // On an error the batch is dropped, and rolled back, with every claim.
            let apply = self.apply_reply(batch.tx(), &o.reply);
            done.push(crate::trace::scope(o.trace, apply).await?);
        }
        batch.commit().await?;
        for _ in 0..duplicates {
            self.stats_duplicate();
        }
        let mut applied = false;
        for (outcome, written) in &done {
            self.count_reply(outcome, written.as_ref());
            applied |= *outcome == ReplyOutcome::Applied;
        }
        if applied {
            crate::failpoint::hit(crate::failpoint::SAGA_AFTER_COMMIT)
                .map_err(StoreError::unavailable)?;
        }
        Ok(())
    }
}
