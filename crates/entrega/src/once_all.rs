//! A poll's messages applied in one transaction, each still once per key: the commit, and
//! its wait for the disk, shared by the whole batch instead of paid per message.

use std::collections::HashSet;

use async_trait::async_trait;
use entrega_core::StoreError;

use crate::worker::handle_each;
use crate::{Db, Handler, HandlerError, Message, Tx, DEFAULT_MAX_BATCH};

/// A transaction with a batch's keys claimed: apply the effect of each message whose key
/// [`is_new`](ClaimedBatch::is_new) in [`tx`](ClaimedBatch::tx), then
/// [`commit`](ClaimedBatch::commit) them all together. Dropped without a commit, it rolls
/// back every effect and every claim.
///
/// ```no_run
/// # async fn run(db: entrega::Db, orders: Vec<(String, String)>) -> Result<(), entrega::StoreError> {
/// use entrega::db::query;
///
/// let keys: Vec<&str> = orders.iter().map(|(key, _)| key.as_str()).collect();
/// let mut batch = db.claim_batch("reparto.envios", &keys).await?;
/// for (key, order) in &orders {
///     if batch.is_new(key) {
///         batch
///             .tx()
///             .execute(query("UPDATE envios SET pagado = 1 WHERE pedido = $1").bind(order))
///             .await?;
///     }
/// }
/// batch.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ClaimedBatch {
    tx: Tx,
    fresh: HashSet<String>,
}

impl ClaimedBatch {
    /// Whether `key` was claimed by this batch and not asked about before: `true` once per
    /// new key, so a key repeated in the batch, like a key claimed before it, is a duplicate
    /// whose effect must not run.
    pub fn is_new(&mut self, key: &str) -> bool {
        self.fresh.remove(key)
    }

    /// The batch's transaction.
    pub fn tx(&mut self) -> &mut Tx {
        &mut self.tx
    }

    /// Commits every effect with every key.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await
    }
}

impl Db {
    /// Opens a transaction and claims every key of `keys` for `consumer` in it
    /// ([`Tx::claim_all`]): the start of a poll applied in one transaction, each message
    /// still once per key. If an effect fails, drop the batch (nothing of it commits) and
    /// apply the messages one by one ([`Db::once`]) to learn which one fails and let the
    /// others through: [`apply_all_or_each`] does this for a handler.
    pub async fn claim_batch(
        &self,
        consumer: &str,
        keys: &[&str],
    ) -> Result<ClaimedBatch, StoreError> {
        let mut tx = self.begin().await?;
        let fresh = tx.claim_all(consumer, keys).await?;
        Ok(ClaimedBatch { tx, fresh })
    }
}

/// A handler that can apply a run of messages in one transaction, all or nothing; with
/// [`apply_all_or_each`] as its [`Handler::handle_batch`], a run that fails is handled one
/// message at a time with [`Handler::handle`].
#[async_trait]
pub trait ApplyAll: Handler {
    /// Messages applied in one transaction at most.
    fn per_tx(&self) -> usize {
        DEFAULT_MAX_BATCH
    }

    /// Applies every message of `run` in one transaction (typically through
    /// [`Db::claim_batch`]), or none of them.
    async fn apply_all(&self, run: &[Message]) -> Result<(), HandlerError>;
}

/// A batch handler's usual shape: runs of up to [`ApplyAll::per_tx`] messages, each applied
/// in one transaction with [`ApplyAll::apply_all`]; if a run fails, its messages are handled
/// one by one with [`Handler::handle`], each in a transaction of its own, so one bad message
/// is retried or dead-lettered alone and the rest go through. A run of one goes straight to
/// `handle`. Like [`Handler::handle_batch`], the results stop right after the first
/// transient failure.
pub async fn apply_all_or_each<H: ApplyAll + ?Sized>(
    handler: &H,
    msgs: &[Message],
) -> Vec<Result<(), HandlerError>> {
    let mut results = Vec::with_capacity(msgs.len());
    for run in msgs.chunks(handler.per_tx().max(1)) {
        let done = if run.len() > 1 {
            match handler.apply_all(run).await {
                Ok(()) => run.iter().map(|_| Ok(())).collect(),
                Err(e) => {
                    tracing::debug!(error = %e, size = run.len(), "a batch failed whole: applying its messages one by one");
                    handle_each(handler, run).await
                }
            }
        } else {
            handle_each(handler, run).await
        };
        let stop =
            done.len() < run.len() || done.iter().any(|r| matches!(r, Err(e) if e.is_transient()));
        results.extend(done);
        if stop {
            break;
        }
    }
    results
}
