//! Request/reply on the log transport (and on Kafka): a request queue is a topic read by one
//! consumer group named after it, a reply queue a topic of its own read by its requester.
//! `reply_to`, `correlation_id` and the request's deadline travel as headers.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega_core::{
    now_ms, Headers, OutgoingMessage, Publisher, Record, RpcDelivery, RpcInbox, RpcMessage,
    RpcTransport, Subscriber, Subscription, TopicAdmin, TransportError,
};

/// Header of the correlation id.
pub const CORRELATION_ID: &str = "entrega-rpc-correlation-id";
/// Header of the reply queue.
pub const REPLY_TO: &str = "entrega-rpc-reply-to";
/// Header of the request's deadline, epoch ms: past it, the request is dropped unread.
pub const EXPIRES_AT: &str = "entrega-rpc-expires-ms";

/// How long a request given back waits before it is delivered again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// [`RpcTransport`] over a log's publisher, subscriber and topic administration.
pub struct LogRpc {
    publisher: Arc<dyn Publisher>,
    subscriber: Arc<dyn Subscriber>,
    admin: Arc<dyn TopicAdmin>,
    partitions: u32,
}

impl std::fmt::Debug for LogRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogRpc")
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl LogRpc {
    /// Request topics get `partitions` partitions (servers share them); reply topics one.
    pub fn new(
        publisher: Arc<dyn Publisher>,
        subscriber: Arc<dyn Subscriber>,
        admin: Arc<dyn TopicAdmin>,
        partitions: u32,
    ) -> Self {
        Self {
            publisher,
            subscriber,
            admin,
            partitions: partitions.max(1),
        }
    }
}

#[async_trait]
impl RpcTransport for LogRpc {
    async fn send(
        &self,
        queue: &str,
        message: &RpcMessage,
        expires_in: Option<Duration>,
    ) -> Result<(), TransportError> {
        let sent = self
            .publisher
            .publish(&[outgoing(queue, message, expires_in)])
            .await;
        match sent {
            // Nobody reads that queue: as RabbitMQ refuses a message no queue takes.
            Err(TransportError::UnknownTopic { topic }) => Err(TransportError::Rejected {
                reason: format!("no queue `{topic}`: nobody reads it"),
            }),
            other => other,
        }
    }

    async fn send_all(&self, messages: &[(&str, &RpcMessage)]) -> Vec<Result<(), TransportError>> {
        let batch: Vec<OutgoingMessage> = messages
            .iter()
            .map(|(queue, message)| outgoing(queue, message, None))
            .collect();
        match self.publisher.publish(&batch).await {
            Ok(()) => messages.iter().map(|_| Ok(())).collect(),
            // One append for the lot failed (a reply queue gone, say): each on its own, so
            // the others still go and the failure is the right one's.
            Err(_) => {
                let mut results = Vec::with_capacity(messages.len());
                for (queue, message) in messages {
                    results.push(self.send(queue, message, None).await);
                }
                results
            }
        }
    }

    async fn serve(
        &self,
        queue: &str,
        consumer: &str,
        prefetch: u16,
    ) -> Result<Box<dyn RpcInbox>, TransportError> {
        self.admin.ensure_topic(queue, self.partitions).await?;
        let sub = self.subscriber.subscribe(queue, queue, consumer).await?;
        Ok(Box::new(LogInbox::new(queue, sub, prefetch)))
    }

    async fn replies(&self, durable: Option<&str>) -> Result<Box<dyn RpcInbox>, TransportError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = durable.map_or_else(|| format!("rpc.respuestas.{id}"), str::to_owned);
        self.admin.ensure_topic(&name, 1).await?;
        let sub = self
            .subscriber
            .subscribe(&name, &name, &format!("{name}.{id}"))
            .await?;
        Ok(Box::new(LogInbox::new(&name, sub, 1000)))
    }
}

/// `message` as a record of the topic `queue`, its RPC properties as headers.
fn outgoing(queue: &str, message: &RpcMessage, expires_in: Option<Duration>) -> OutgoingMessage {
    let mut headers = message.headers.clone();
    headers.set(CORRELATION_ID, message.correlation_id.clone());
    if let Some(reply_to) = &message.reply_to {
        headers.set(REPLY_TO, reply_to.clone());
    }
    if let Some(ttl) = expires_in {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        headers.set(EXPIRES_AT, now_ms().saturating_add(ms).to_string());
    }
    OutgoingMessage {
        topic: queue.to_owned(),
        key: Some(message.correlation_id.clone()),
        headers,
        payload: message.payload.clone(),
    }
}

/// A topic read as a queue: each record a delivery, committed once every record before it in
/// its partition was acknowledged.
struct LogInbox {
    address: String,
    sub: Box<dyn Subscription>,
    prefetch: usize,
    next_tag: u64,
    /// Deliveries out, by tag: (partition, offset, the delivery for a retry).
    out: HashMap<u64, (u32, i64, RpcDelivery)>,
    /// Per partition, offsets delivered and not yet acknowledged.
    open: BTreeMap<u32, BTreeSet<i64>>,
    /// Per partition, the next offset after everything delivered.
    seen: BTreeMap<u32, i64>,
    /// Deliveries given back, with when they come again.
    again: VecDeque<(Instant, RpcDelivery)>,
}

impl LogInbox {
    fn new(address: &str, sub: Box<dyn Subscription>, prefetch: u16) -> Self {
        Self {
            address: address.to_owned(),
            sub,
            prefetch: usize::from(prefetch.max(1)),
            next_tag: 1,
            out: HashMap::new(),
            open: BTreeMap::new(),
            seen: BTreeMap::new(),
            again: VecDeque::new(),
        }
    }

    fn delivery(&mut self, record: Record) -> Option<RpcDelivery> {
        let h = &record.headers;
        let expired = h
            .get_current(EXPIRES_AT)
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|t| t < now_ms());
        let (partition, offset) = (record.partition, record.offset);
        let next = self.seen.entry(partition).or_insert(offset + 1);
        *next = (*next).max(offset + 1);
        if expired {
            return None;
        }
        let mut headers = Headers::new();
        for (name, value) in h.iter() {
            let former_expiry = entrega_core::headers::former::RPC_EXPIRA_MS;
            if ![CORRELATION_ID, REPLY_TO, EXPIRES_AT, former_expiry].contains(&name) {
                headers.push(name, value);
            }
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let delivery = RpcDelivery {
            message: RpcMessage {
                correlation_id: h.get(CORRELATION_ID).unwrap_or_default().to_owned(),
                reply_to: h.get(REPLY_TO).map(str::to_owned),
                headers,
                payload: record.payload,
                durable: true,
            },
            tag,
            redelivered: false,
        };
        self.open.entry(partition).or_default().insert(offset);
        self.out.insert(tag, (partition, offset, delivery.clone()));
        Some(delivery)
    }

    /// Commits, per partition, up to the lowest offset still open.
    async fn commit(&mut self, partition: u32) -> Result<(), TransportError> {
        let Some(seen) = self.seen.get(&partition).copied() else {
            return Ok(());
        };
        let next = self
            .open
            .get(&partition)
            .and_then(|o| o.first().copied())
            .unwrap_or(seen);
        match self.sub.commit(&[(partition, next)]).await {
            // Taken away: its open records come again to the new holder.
            Ok(()) | Err(TransportError::NotAssigned { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl RpcInbox for LogInbox {
    fn address(&self) -> &str {
        &self.address
    }

    async fn next(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RpcDelivery>, TransportError> {
        let max = max.clamp(1, self.prefetch);
        let now = Instant::now();
        let mut ready = Vec::new();
        while ready.len() < max && self.again.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, delivery)) = self.again.pop_front() {
                ready.push(delivery);
            }
        }
        if !ready.is_empty() {
            return Ok(ready);
        }
        let room = self.prefetch.saturating_sub(self.out.len());
        if room == 0 {
            tokio::time::sleep(wait.min(RETRY_AFTER)).await;
            return Ok(Vec::new());
        }
        let wait = self.again.front().map_or(wait, |(due, _)| {
            wait.min(due.saturating_duration_since(now))
        });
        let records = self.sub.poll(max.min(room), wait).await?;
        let mut touched = BTreeSet::new();
        for record in records {
            touched.insert(record.partition);
            if let Some(delivery) = self.delivery(record) {
                ready.push(delivery);
            }
        }
        for partition in touched {
            self.commit(partition).await?;
        }
        Ok(ready)
    }

    async fn ack(&mut self, tag: u64) -> Result<(), TransportError> {
        let Some((partition, offset, _)) = self.out.remove(&tag) else {
            return Ok(());
        };
        if let Some(open) = self.open.get_mut(&partition) {
            open.remove(&offset);
        }
        self.commit(partition).await
    }

    async fn ack_all(&mut self, tags: &[u64]) -> Result<(), TransportError> {
        let mut touched = BTreeSet::new();
        for tag in tags {
            if let Some((partition, offset, _)) = self.out.remove(tag) {
                if let Some(open) = self.open.get_mut(&partition) {
                    open.remove(&offset);
                }
                touched.insert(partition);
            }
        }
        for partition in touched {
            self.commit(partition).await?;
        }
        Ok(())
    }

    async fn retry(&mut self, tag: u64) -> Result<(), TransportError> {
        if let Some((_, _, delivery)) = self.out.get(&tag) {
            let mut again = delivery.clone();
            again.redelivered = true;
            self.again.push_back((Instant::now() + RETRY_AFTER, again));
        }
        Ok(())
    }
}
