//! The console's dead letters, on whichever broker the deployment uses: the topic tool of
//! `entrega::dlq` (log transport, Kafka) or the queue tool (RabbitMQ), behind one face.

use std::sync::Arc;

use entrega::dlq::{
    ActionReport, DeadLetter, DeadLetters, DiscardOptions, DlqError, DlqFilter, QueueDeadLetters,
    ReplayOptions,
};
use entrega_core::{DeadLetterId, DlqAuditEntry, DlqStore};

use crate::services::inventario;
use crate::wiring::{dead_letter_topic, Broker};

/// Dead letters of km0's tended topic or queue.
pub enum Letters {
    /// `pedidos.eventos.dlq` on the log transport or Kafka.
    Topics(DeadLetters),
    /// `inventario.pedidos.dlq` on RabbitMQ.
    Queue(QueueDeadLetters),
}

impl Letters {
    /// The tool for `broker`, keeping its operator state in `store`.
    pub fn new(broker: &Broker, store: Arc<dyn DlqStore>) -> Self {
        match broker.as_amqp() {
            Some(amqp) => Self::Queue(QueueDeadLetters::new(
                amqp.clone(),
                inventario::GROUP,
                inventario::TOPIC,
                store,
            )),
            None => Self::Topics(DeadLetters::new(
                broker.inspector(),
                broker.publisher(),
                store,
                vec![dead_letter_topic()],
            )),
        }
    }

    /// Where the dead letters are: the topic or the queue.
    pub fn place(&self) -> String {
        match self {
            Self::Topics(_) => dead_letter_topic(),
            Self::Queue(tool) => tool.queue().to_owned(),
        }
    }

    /// The dead letters `filter` selects, pending only unless `all`.
    pub async fn list(&self, filter: &DlqFilter, all: bool) -> Result<Vec<DeadLetter>, DlqError> {
        match self {
            Self::Topics(tool) => tool.list(filter, all).await,
            Self::Queue(tool) => {
                let letters = tool.list(filter).await?;
                Ok(letters
                    .into_iter()
                    .filter(|l| all || l.is_pending())
                    .collect())
            }
        }
    }

    /// One dead letter and the others of its event.
    pub async fn show(&self, id: &DeadLetterId) -> Result<(DeadLetter, Vec<DeadLetter>), DlqError> {
        match self {
            Self::Topics(tool) => tool.show(id).await,
            Self::Queue(tool) => tool.show(id).await,
        }
    }

    /// Replays what `filter` selects.
    pub async fn replay(
        &self,
        filter: &DlqFilter,
        options: &ReplayOptions,
    ) -> Result<ActionReport, DlqError> {
        match self {
            Self::Topics(tool) => tool.replay(filter, options).await,
            Self::Queue(tool) => tool.replay(filter, options).await,
        }
    }

    /// Discards what `filter` selects.
    pub async fn discard(
        &self,
        filter: &DlqFilter,
        options: &DiscardOptions,
    ) -> Result<ActionReport, DlqError> {
        match self {
            Self::Topics(tool) => tool.discard(filter, options).await,
            Self::Queue(tool) => tool.discard(filter, options).await,
        }
    }

    /// The latest operator actions.
    pub async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, DlqError> {
        match self {
            Self::Topics(tool) => tool.audit(limit).await,
            Self::Queue(tool) => tool.audit(limit).await,
        }
    }
}
