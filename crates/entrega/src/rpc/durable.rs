//! Durable request/reply: requests that survive the requester.
//!
//! The requester records each request in its own database ([`Tx::request`], in the same
//! transaction as the change that needs the answer), like an outbox row. A
//! [`DurableRequester`] sends what is pending (and sends again what stayed unanswered too
//! long), reads the replies from a durable named queue, and applies each through the inbox:
//! the reply's correlation id is claimed, the request marked answered and the application's
//! effect written in one transaction, then the reply acknowledged. A requester killed with
//! calls in flight finds, after its restart, its requests still recorded and their replies
//! waiting in its queue: every reply is applied once. Past its deadline a request is marked
//! `expired`; a reply that comes after that is kept on the row and counted as late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    now_ms, HandlerError, Headers, RpcMessage, RpcTransport, StoreError, TransportError,
};
use tokio_util::sync::CancellationToken;

use crate::db::{query, Db, Tx};

/// A recorded request, as the reply handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRequest {
    /// Its correlation id.
    pub correlation_id: String,
    /// The queue it was sent to.
    pub queue: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Its deadline, epoch ms.
    pub deadline_ms: i64,
}

/// Applies replies to recorded requests.
#[async_trait]
pub trait ReplyHandler: Send + Sync {
    /// Applies `reply` to `request` in `tx`, the transaction that marks it answered.
    async fn apply(
        &self,
        tx: &mut Tx,
        request: &PendingRequest,
        reply: &RpcMessage,
    ) -> Result<(), HandlerError>;
}

/// Settings of a durable requester.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DurableConfig {
    /// The durable reply queue, and the inbox consumer its replies are claimed under.
    pub name: String,
    /// A request sent this long ago and still unanswered is sent again.
    pub resend_after: Duration,
    /// Longest wait for replies before pending requests are looked at again.
    pub poll: Duration,
}

impl DurableConfig {
    /// Defaults for the reply queue `name`: resend after 10 s, look every 200 ms.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            resend_after: Duration::from_secs(10),
            poll: Duration::from_millis(200),
        }
    }
}

/// Counters of a durable requester.
#[derive(Debug, Default)]
pub struct DurableStats {
    /// Requests sent (first sends).
    pub sent: AtomicU64,
    /// Requests sent again, unanswered after `resend_after`.
    pub resent: AtomicU64,
    /// Replies applied.
    pub applied: AtomicU64,
    /// Replies whose correlation id was claimed already: acknowledged, nothing applied.
    pub duplicates: AtomicU64,
    /// Replies to requests past their deadline (or unknown): kept, not applied.
    pub late: AtomicU64,
    /// Requests that reached their deadline unanswered.
    pub expired: AtomicU64,
}

impl DurableStats {
    /// Replies applied so far.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }
}

/// Sends recorded requests and applies their replies; see the module docs.
pub struct DurableRequester {
    db: Db,
    transport: Arc<dyn RpcTransport>,
    handler: Arc<dyn ReplyHandler>,
    config: DurableConfig,
    stats: Arc<DurableStats>,
}

impl std::fmt::Debug for DurableRequester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableRequester")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Most requests sent per round.
const SEND_BATCH: i64 = 200;
/// Most replies applied per round.
const REPLY_BATCH: usize = 256;

/// A recorded request as read: correlation id, queue, body, deadline.
type RequestRow = (String, String, Vec<u8>, i64);
/// A request due to be sent: its [`RequestRow`] and when it was last sent.
type DueRow = (String, String, Vec<u8>, i64, Option<i64>);

impl DurableRequester {
    /// A requester over `db` (migrated with [`MigrationSet::Rpc`](entrega_core::MigrationSet)
    /// and `Inbox`, which claims the replies).
    pub fn new(
        db: Db,
        transport: Arc<dyn RpcTransport>,
        handler: Arc<dyn ReplyHandler>,
        config: DurableConfig,
    ) -> Self {
        Self {
            db,
            transport,
            handler,
            config,
            stats: Arc::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<DurableStats> {
        Arc::clone(&self.stats)
    }

    /// Sends, resends, expires and applies until `stop`. The reply queue is opened first, so
    /// no reply comes before there is a queue for it.
    pub async fn run(&self, stop: CancellationToken) -> Result<(), TransportError> {
        let mut inbox = self.transport.replies(Some(&self.config.name)).await?;
        while !stop.is_cancelled() {
            if let Err(e) = self.send_due(inbox.address()).await {
                tracing::warn!(error = %e, "sending recorded requests failed; next round");
            }
            if let Err(e) = self.expire().await {
                tracing::warn!(error = %e, "expiring recorded requests failed; next round");
            }
            let replies = tokio::select! {
                () = stop.cancelled() => break,
                replies = inbox.next(REPLY_BATCH, self.config.poll) => replies?,
            };
            for reply in replies {
                let tag = reply.tag;
                match self.apply(&reply.message).await {
                    Ok(()) => inbox.ack(tag).await?,
                    Err(e) => {
                        tracing::warn!(error = %e, "applying a reply failed; it comes again");
                        inbox.retry(tag).await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn send_due(&self, reply_to: &str) -> Result<(), StoreError> {
        let now = now_ms();
        let resend_before =
            now - i64::try_from(self.config.resend_after.as_millis()).unwrap_or(i64::MAX);
        let due: Vec<DueRow> = self
            .db
            .fetch_all(
                query(
                    "SELECT correlation_id, queue, payload, deadline_ms, sent_at_ms \
                     FROM entrega_requests WHERE state = 'pending' \
                     OR (state = 'sent' AND sent_at_ms < $1) ORDER BY created_at_ms LIMIT $2",
                )
                .bind(resend_before)
                .bind(SEND_BATCH),
            )
            .await?;
        for (correlation_id, queue, payload, deadline_ms, sent_ms) in due {
            if deadline_ms <= now {
                continue;
            }
            let message = RpcMessage {
                correlation_id: correlation_id.clone(),
                reply_to: Some(reply_to.to_owned()),
                headers: Headers::new(),
                payload,
                durable: true,
            };
            let ttl = Duration::from_millis(u64::try_from(deadline_ms - now).unwrap_or(0));
            if let Err(e) = self.transport.send(&queue, &message, Some(ttl)).await {
                tracing::warn!(%queue, error = %e, "sending a recorded request failed");
                continue;
            }
            let counter = if sent_ms.is_some() {
                &self.stats.resent
            } else {
                &self.stats.sent
            };
            counter.fetch_add(1, Ordering::Relaxed);
            self.db
                .execute(
                    query(
                        "UPDATE entrega_requests SET state = 'sent', sent_at_ms = $1 \
                         WHERE correlation_id = $2 AND state IN ('pending', 'sent')",
                    )
                    .bind(now_ms())
                    .bind(correlation_id),
                )
                .await?;
        }
        Ok(())
    }

    async fn expire(&self) -> Result<(), StoreError> {
        let expired = self
            .db
            .execute(
                query(
                    "UPDATE entrega_requests SET state = 'expired' \
                     WHERE state IN ('pending', 'sent') AND deadline_ms <= $1",
                )
                .bind(now_ms()),
            )
            .await?;
        self.stats.expired.fetch_add(expired, Ordering::Relaxed);
        Ok(())
    }

    /// Claims the reply, marks its request answered and applies it, in one transaction.
    async fn apply(&self, reply: &RpcMessage) -> Result<(), HandlerError> {
        let id = &reply.correlation_id;
        let mut tx = self.db.begin().await?;
        if !tx.claim(&self.config.name, id).await? {
            tx.rollback().await?;
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let row: Option<RequestRow> = tx
            .fetch_optional(
                query(
                    "SELECT correlation_id, queue, payload, deadline_ms FROM entrega_requests \
                     WHERE correlation_id = $1 AND state IN ('pending', 'sent')",
                )
                .bind(id.clone()),
            )
            .await?;
        let Some((correlation_id, queue, payload, deadline_ms)) = row else {
            // Past its deadline, or never recorded here: kept on the row, not applied.
            tx.execute(
                query(
                    "UPDATE entrega_requests SET reply = $1, replied_at_ms = $2 \
                     WHERE correlation_id = $3",
                )
                .bind(reply.payload.clone())
                .bind(now_ms())
                .bind(id.clone()),
            )
            .await?;
            tx.commit().await?;
            self.stats.late.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let request = PendingRequest {
            correlation_id,
            queue,
            payload,
            deadline_ms,
        };
        self.handler.apply(&mut tx, &request, reply).await?;
        tx.execute(
            query(
                "UPDATE entrega_requests SET state = 'replied', reply = $1, \
                 replied_at_ms = $2 WHERE correlation_id = $3",
            )
            .bind(reply.payload.clone())
            .bind(now_ms())
            .bind(id.clone()),
        )
        .await?;
        tx.commit().await?;
        self.stats.applied.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
