//! Idempotent request handling: the answer to a request is stored, by the request's own key,
//! in the same transaction as the effect, and a repeated request (a caller retrying after a
//! timeout, a redelivery after a crash) gets that stored answer back, with no second effect.
//!
//! A batch of requests is applied in one transaction: one read of the answers stored for its
//! keys, each new request applied and its answer stored, one commit. While no repeat has
//! been seen lately the read is skipped: every request is applied and its answer stored, and
//! an answer already stored (the insert writes fewer rows) rolls the whole transaction back
//! and the batch goes the careful way. If anything fails the transaction is rolled back
//! whole and each request is handled in a transaction of its own, so a request that fails
//! costs the others another attempt, never a wrong answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{HandlerError, RpcMessage};

use super::server::RpcHandler;
use crate::db::{insert_answers, Db, Query, Repeat, Tx};

/// A request's effect, applied inside the transaction that stores its answer.
#[async_trait]
pub trait AnswerInTx: Send + Sync {
    /// The key that names the request across retries (e.g. `autorizacion-<pedido_id>`),
    /// never a fresh random id; an error is permanent (a request that cannot be named).
    fn key(&self, request: &RpcMessage) -> Result<String, HandlerError>;

    /// Applies the request in `tx` and returns the answer's body.
    async fn answer_in(&self, tx: &mut Tx, request: &RpcMessage) -> Result<Vec<u8>, HandlerError>;

    /// Applies several requests, none known to have been answered before, in `tx`: one
    /// answer per request, in order. It may be given a request answered before; storing
    /// the answers then finds it and the transaction is rolled back, so nothing of it stays.
    /// By default each is [`answer_in`](Self::answer_in)ed in turn; an effect that can be
    /// written for many requests in one statement overrides it. Any error rolls the whole
    /// transaction back, and the requests are then applied the careful way.
    async fn answer_all_in(
        &self,
        tx: &mut Tx,
        requests: &[&RpcMessage],
    ) -> Result<Vec<Vec<u8>>, HandlerError> {
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            answers.push(self.answer_in(tx, request).await?);
        }
        Ok(answers)
    }

    /// The effect of several requests, none known to have been answered before, as
    /// statements that need nothing read back, with one answer per request in order. They
    /// are written with the stored answers by one [`Db::write_batch`]: one round trip to
    /// the database for the whole batch, where [`answer_all_in`](Self::answer_all_in)
    /// takes one per statement, plus the transaction's begin and commit. The statements
    /// must not depend on each other (see [`Db::write_batch`]).
    ///
    /// `None`, the default: the effect needs its transaction, and
    /// [`answer_all_in`](Self::answer_all_in) applies it. An error sends the batch the
    /// careful way, as a failing [`answer_all_in`](Self::answer_all_in) does.
    fn writes_for(&self, requests: &[&RpcMessage]) -> Option<Result<Writes, HandlerError>> {
        let _ = requests;
        None
    }
}

/// A batch's effect as statements, and its answers ([`AnswerInTx::writes_for`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Writes {
    /// The statements that apply the effect, run in order in one transaction with the
    /// stored answers.
    pub statements: Vec<Query>,
    /// The answer to each request, in order.
    pub answers: Vec<Vec<u8>>,
}

/// Counters of a [`StoredAnswers`].
#[derive(Debug, Default)]
pub struct StoredAnswerStats {
    /// Requests applied for the first time.
    pub applied: AtomicU64,
    /// Requests answered from the stored answer.
    pub repeated: AtomicU64,
    /// Batches that could not be applied in one transaction and were handled one request
    /// at a time.
    pub fallbacks: AtomicU64,
    /// Batches applied as if none of their requests had been answered before, then rolled
    /// back because one had been (and applied again the careful way).
    pub refuted: AtomicU64,
}

/// An [`RpcHandler`] that applies each request once, by [`AnswerInTx::key`], and answers a
/// repeat with the answer stored the first time (`entrega_answers`, migrated with
/// [`MigrationSet::Rpc`](entrega_core::MigrationSet::Rpc), with
/// [`MigrationSet::Inbox`](entrega_core::MigrationSet::Inbox) for the handler's own claims).
pub struct StoredAnswers<H> {
    db: Db,
    consumer: String,
    inner: H,
    stats: Arc<StoredAnswerStats>,
    /// Whether a recent batch held requests answered before: batches then read the stored
    /// answers before applying anything.
    repeats_lately: AtomicBool,
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
            repeats_lately: AtomicBool::new(false),
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
        let stored = tx
            .stored_answer(&self.consumer, &key)
            .await
            .map_err(HandlerError::from)?;
        self.repeats_lately
            .store(stored.is_some(), Ordering::Relaxed);
        if let Some(stored) = stored {
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

    /// One transaction for the whole batch (one commit: group commit). While no repeat has
    /// been seen lately, the batch is first applied without reading the stored answers
    /// (one statement fewer), which storing the answers proves right or rolls back. Should
    /// anything fail, each request is handled on its own, so one bad request costs the
    /// others only another attempt, never their answers.
    async fn answer_batch(&self, requests: &[&RpcMessage]) -> Vec<Result<Vec<u8>, HandlerError>> {
        let mut refutable = false;
        if !self.repeats_lately.load(Ordering::Relaxed) {
            match self.apply_unseen(requests).await {
                Unseen::Applied(answers) => return answers,
                Unseen::Failed => refutable = true,
                Unseen::NotTried => {}
            }
        }
        let answers = self.apply_carefully(requests).await;
        // The careful way read the stored answers: did they hold one of this batch's?
        if refutable && self.repeats_lately.load(Ordering::Relaxed) {
            self.stats.refuted.fetch_add(1, Ordering::Relaxed);
        }
        answers
    }
}

/// What became of a batch applied as if none of its requests had been answered before.
enum Unseen {
    /// Applied and committed: the answers, one per request.
    Applied(Vec<Result<Vec<u8>, HandlerError>>),
    /// Rolled back (a request answered before, or a failure): nothing of it stays.
    Failed,
    /// Not tried: a key twice in the batch, or no request with a key.
    NotTried,
}

impl<H: AnswerInTx> StoredAnswers<H> {
    /// The batch in one transaction that reads the stored answers first, or, should that
    /// fail, each request on its own.
    async fn apply_carefully(
        &self,
        requests: &[&RpcMessage],
    ) -> Vec<Result<Vec<u8>, HandlerError>> {
        if requests.len() > 1 {
            if let Some(answers) = self.apply_together(requests).await {
                return answers;
            }
            self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            answers.push(self.answer(request).await);
        }
        answers
    }

    /// Applies `requests` in one transaction as if none had been seen before: every effect
    /// applied, every answer stored, one commit, no read of the stored answers. Storing an
    /// answer under a key stored already fails (or falls short), and the whole transaction
    /// is rolled back. With the effect as statements ([`AnswerInTx::writes_for`]) the batch
    /// is one round trip to the database ([`Db::write_batch`]).
    async fn apply_unseen(&self, requests: &[&RpcMessage]) -> Unseen {
        let keys: Vec<Result<String, HandlerError>> =
            requests.iter().map(|r| self.inner.key(r)).collect();
        let mut named = Vec::with_capacity(keys.len());
        let mut seen = std::collections::HashSet::new();
        for (request, key) in requests.iter().zip(&keys) {
            if let Ok(key) = key {
                if !seen.insert(key.as_str()) {
                    return Unseen::NotTried;
                }
                named.push((key.as_str(), *request));
            }
        }
        if named.is_empty() {
            return Unseen::NotTried;
        }
        let to_apply: Vec<&RpcMessage> = named.iter().map(|(_, r)| *r).collect();
        let applied = match self.inner.writes_for(&to_apply) {
            Some(writes) => self.write_unseen(&named, writes).await,
            None => self.transact_unseen(&named).await,
        };
        let Some(applied) = applied else {
            return Unseen::Failed;
        };
        self.stats
            .applied
            .fetch_add(named.len() as u64, Ordering::Relaxed);
        let mut applied = applied.into_iter();
        Unseen::Applied(
            keys.iter()
                .map(|key| match key {
                    Ok(_) => applied
                        .next()
                        .ok_or_else(|| HandlerError::transient("an answer went missing")),
                    Err(e) => Err(copy_of(e)),
                })
                .collect(),
        )
    }

    /// The effect's statements and the answers, in one [`Db::write_batch`]; an answer
    /// stored before under one of the keys fails it whole.
    async fn write_unseen(
        &self,
        named: &[(&str, &RpcMessage)],
        writes: Result<Writes, HandlerError>,
    ) -> Option<Vec<Vec<u8>>> {
        let Writes {
            mut statements,
            answers,
        } = writes.ok()?;
        let rows = keyed(named, &answers)?;
        statements.extend(insert_answers(&self.consumer, &rows, Repeat::Fail));
        if let Err(e) = self.db.write_batch(statements).await {
            tracing::debug!(error = %e, "a batch applied as unseen was rolled back");
            return None;
        }
        Some(answers)
    }

    /// The effect applied in a transaction, the answers stored after it, one commit.
    async fn transact_unseen(&self, named: &[(&str, &RpcMessage)]) -> Option<Vec<Vec<u8>>> {
        let mut tx = self.db.begin().await.ok()?;
        let applied = self.apply_and_store(&mut tx, named).await??;
        tx.commit().await.ok()?;
        Some(applied)
    }

    /// Applies the `named` requests in `tx` and stores their answers under their keys. The
    /// answers, in order, when every one was stored; `Some(None)` when fewer rows were
    /// written (an answer stored before under one of the keys); `None` when the effect or a
    /// statement failed.
    async fn apply_and_store(
        &self,
        tx: &mut Tx,
        named: &[(&str, &RpcMessage)],
    ) -> Option<Option<Vec<Vec<u8>>>> {
        let to_apply: Vec<&RpcMessage> = named.iter().map(|(_, r)| *r).collect();
        let applied = self.inner.answer_all_in(tx, &to_apply).await.ok()?;
        let rows = keyed(named, &applied)?;
        let written = tx.store_answers(&self.consumer, &rows).await.ok()?;
        Some((written == rows.len() as u64).then_some(applied))
    }

    /// Applies `requests` in one transaction: the stored answers of those seen before read
    /// in one query, the others applied and stored, one commit. `None` when anything in it
    /// failed (a request's effect, a conflict with another handling, the commit): the
    /// transaction is rolled back and nothing of it counts.
    async fn apply_together(
        &self,
        requests: &[&RpcMessage],
    ) -> Option<Vec<Result<Vec<u8>, HandlerError>>> {
        let keys: Vec<Result<String, HandlerError>> =
            requests.iter().map(|r| self.inner.key(r)).collect();
        let named: Vec<&str> = keys
            .iter()
            .filter_map(|k| k.as_ref().ok().map(String::as_str))
            .collect();
        let mut tx = self.db.begin().await.ok()?;
        let mut answers = tx.stored_answers(&self.consumer, &named).await.ok()?;
        // Repeats are rare again once a batch finds none: skip the read again.
        self.repeats_lately
            .store(!answers.is_empty(), Ordering::Relaxed);
        // The requests to apply: the first of each key with no stored answer. A repeat within
        // the batch gets its first one's answer.
        let mut fresh: Vec<(&str, &RpcMessage)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (request, key) in requests.iter().zip(&keys) {
            if let Ok(key) = key {
                if !answers.contains_key(key) && seen.insert(key.as_str()) {
                    fresh.push((key.as_str(), request));
                }
            }
        }
        if !fresh.is_empty() {
            // `None` inside: another handling stored some of these answers first.
            let applied = self.apply_and_store(&mut tx, &fresh).await??;
            answers.extend(fresh.iter().map(|(k, _)| (*k).to_owned()).zip(applied));
        }
        tx.commit().await.ok()?;
        let applied = fresh.len() as u64;
        let results: Vec<Result<Vec<u8>, HandlerError>> = keys
            .iter()
            .map(|key| match key {
                Ok(key) => answers
                    .get(key)
                    .cloned()
                    .ok_or_else(|| HandlerError::transient(LostAnswer(key.clone()))),
                Err(e) => Err(copy_of(e)),
            })
            .collect();
        let answered = results.iter().filter(|r| r.is_ok()).count() as u64;
        self.stats.applied.fetch_add(applied, Ordering::Relaxed);
        self.stats
            .repeated
            .fetch_add(answered.saturating_sub(applied), Ordering::Relaxed);
        Some(results)
    }
}

/// Each answer beside its request's key, to be stored; `None` when the effect gave another
/// number of answers than there are requests.
fn keyed<'a>(
    named: &[(&'a str, &RpcMessage)],
    answers: &'a [Vec<u8>],
) -> Option<Vec<(&'a str, &'a [u8])>> {
    (answers.len() == named.len()).then(|| {
        named
            .iter()
            .zip(answers)
            .map(|((key, _), answer)| (*key, answer.as_slice()))
            .collect()
    })
}

/// The same failure, of the same class (the key's error is kept for the names of the batch).
fn copy_of(e: &HandlerError) -> HandlerError {
    if e.is_transient() {
        HandlerError::transient(e.to_string())
    } else {
        HandlerError::permanent(e.to_string())
    }
}

/// An answer another transaction stored and that could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("the stored answer of request `{0}` could not be read")]
struct LostAnswer(String);
