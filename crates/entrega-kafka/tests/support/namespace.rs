//! Gives every scenario its own topics and groups on a shared broker: names are suffixed on
//! the way in and the suffix is removed from what comes back, so scenarios written with fixed
//! names (`pedidos.eventos`, group `inventario`) never meet each other's data.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    LogInspector, OutgoingMessage, Publisher, Record, Subscriber, Subscription, TopicAdmin,
    TransportError,
};

/// A unique suffix and the renaming both ways.
#[derive(Debug, Clone)]
pub struct Namespace {
    suffix: String,
}

impl Namespace {
    /// A fresh namespace.
    pub fn fresh() -> Self {
        Self {
            suffix: format!(".{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// The broker-side name of `name`.
    pub fn wrap(&self, name: &str) -> String {
        format!("{name}{}", self.suffix)
    }

    /// The scenario-side name of a broker-side `name`.
    pub fn unwrap(&self, name: &str) -> String {
        name.strip_suffix(&self.suffix).unwrap_or(name).to_owned()
    }

    fn error(&self, e: TransportError) -> TransportError {
        match e {
            TransportError::UnknownTopic { topic } => TransportError::UnknownTopic {
                topic: self.unwrap(&topic),
            },
            TransportError::NotAssigned { topic, partition } => TransportError::NotAssigned {
                topic: self.unwrap(&topic),
                partition,
            },
            other => other,
        }
    }

    fn record(&self, mut r: Record) -> Record {
        r.topic = self.unwrap(&r.topic);
        r
    }
}

/// [`Publisher`] under a namespace.
pub struct NsPublisher(pub Arc<dyn Publisher>, pub Namespace);

#[async_trait]
impl Publisher for NsPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let renamed: Vec<OutgoingMessage> = batch
            .iter()
            .map(|m| OutgoingMessage {
                topic: self.1.wrap(&m.topic),
                ..m.clone()
            })
            .collect();
        self.0.publish(&renamed).await.map_err(|e| self.1.error(e))
    }
}

/// [`TopicAdmin`] under a namespace.
pub struct NsAdmin(pub Arc<dyn TopicAdmin>, pub Namespace);

#[async_trait]
impl TopicAdmin for NsAdmin {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        self.0
            .ensure_topic(&self.1.wrap(topic), partitions)
            .await
            .map_err(|e| self.1.error(e))
    }
}

/// [`Subscriber`] under a namespace: topics and groups are renamed.
pub struct NsSubscriber(pub Arc<dyn Subscriber>, pub Namespace);

#[async_trait]
impl Subscriber for NsSubscriber {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        let inner = self
            .0
            .subscribe(&self.1.wrap(group), &self.1.wrap(topic), member)
            .await
            .map_err(|e| self.1.error(e))?;
        Ok(Box::new(NsSubscription(inner, self.1.clone())))
    }
}

/// [`Subscription`] under a namespace.
pub struct NsSubscription(pub Box<dyn Subscription>, pub Namespace);

#[async_trait]
impl Subscription for NsSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        let records = self.0.poll(max, wait).await.map_err(|e| self.1.error(e))?;
        Ok(records.into_iter().map(|r| self.1.record(r)).collect())
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        self.0.commit(offsets).await.map_err(|e| self.1.error(e))
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        self.0.seek(partition, offset)
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        self.0.pause_for(partition, until)
    }

    fn assignment(&self) -> Vec<u32> {
        self.0.assignment()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        self.0.close().await.map_err(|e| self.1.error(e))
    }
}

/// [`LogInspector`] under a namespace.
pub struct NsInspector(pub Arc<dyn LogInspector>, pub Namespace);

#[async_trait]
impl LogInspector for NsInspector {
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        self.0.end_offsets(&self.1.wrap(topic)).await
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        self.0
            .committed(&self.1.wrap(group), &self.1.wrap(topic))
            .await
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        let records = self
            .0
            .read(&self.1.wrap(topic), partition, from, max)
            .await
            .map_err(|e| self.1.error(e))?;
        Ok(records.into_iter().map(|r| self.1.record(r)).collect())
    }
}
