//! Idempotent request handling: the answer to a request is stored, by the request's own key,
//! in the same transaction as the effect, and a repeated request (a caller retrying after a
//! timeout, a redelivery after a crash) gets that stored answer back, with no second effect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{HandlerError, RpcMessage};

use super::server::RpcHandler;
use crate::db::{Db, Tx};

/// A request's effect, applied inside the transaction that stores its answer.
#[async_trait]
pub trait AnswerInTx: Send + Sync {
    /// The key that names the request across retries (e.g. `autorizacion-<pedido_id>`),
    /// never a fresh random id; an error is permanent (a request that cannot be named).
    fn key(&self, request: &RpcMessage) -> Result<String, HandlerError>;

    /// Applies the request in `tx` and returns the answer's body.
    async fn answer_in(&self, tx: &mut Tx, request: &RpcMessage) -> Result<Vec<u8>, HandlerError>;
}

/// Counters of a [`StoredAnswers`].
#[derive(Debug, Default)]
pub struct StoredAnswerStats {
    /// Requests applied for the first time.
    pub applied: AtomicU64,
    /// Requests answered from the stored answer.
    pub repeated: AtomicU64,
}

/// An [`RpcHandler`] that applies each request once, by [`AnswerInTx::key`], and answers a
/// repeat with the answer stored the first time (`entrega_respuestas`, migrated with
/// [`MigrationSet::Inbox`](entrega_core::MigrationSet::Inbox)).
pub struct StoredAnswers<H> {
    db: Db,
    consumer: String,
    inner: H,
    stats: Arc<StoredAnswerStats>,
}

impl<H> std::fmt::Debug for StoredAnswers<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredAnswers")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl<H: AnswerInTx> StoredAnswers<H> {
    /// Answers through `inner`, storing answers in `db` under `consumer`.
    pub fn new(db: Db, consumer: impl Into<String>, inner: H) -> Self {
        Self {
            db,
            consumer: consumer.into(),
            inner,
            stats: Arc::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<StoredAnswerStats> {
        Arc::clone(&self.stats)
    }
}

#[async_trait]
impl<H: AnswerInTx> RpcHandler for StoredAnswers<H> {
    async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        let key = self.inner.key(request)?;
        let mut tx = self.db.begin().await.map_err(HandlerError::from)?;
        if let Some(stored) = tx
            .stored_answer(&self.consumer, &key)
            .await
            .map_err(HandlerError::from)?
        {
            tx.rollback().await.map_err(HandlerError::from)?;
            self.stats.repeated.fetch_add(1, Ordering::Relaxed);
            return Ok(stored);
        }
        let answer = self.inner.answer_in(&mut tx, request).await?;
        let first = tx
            .store_answer(&self.consumer, &key, &answer)
            .await
            .map_err(HandlerError::from)?;
        if !first {
            // Another handling of the same request committed first: its answer stands.
            tx.rollback().await.map_err(HandlerError::from)?;
            let mut tx = self.db.begin().await.map_err(HandlerError::from)?;
            let stored = tx
                .stored_answer(&self.consumer, &key)
                .await
                .map_err(HandlerError::from)?;
            tx.rollback().await.map_err(HandlerError::from)?;
            self.stats.repeated.fetch_add(1, Ordering::Relaxed);
            return stored.ok_or_else(|| HandlerError::transient(LostAnswer(key)));
        }
        tx.commit().await.map_err(HandlerError::from)?;
        self.stats.applied.fetch_add(1, Ordering::Relaxed);
        Ok(answer)
    }
}

/// An answer another transaction stored and that could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("the stored answer of request `{0}` could not be read")]
struct LostAnswer(String);
