//! Creating topics and their partitions.

use async_trait::async_trait;
use entrega_core::{TopicAdmin, TransportError};

use super::PgLog;
use crate::errors::transport;

impl PgLog {
    /// Creates `topic` with `partitions` partitions unless it exists; returns the count it has.
    pub(crate) async fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<u32, TransportError> {
        let wanted = match i32::try_from(partitions) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(TransportError::Rejected {
                    reason: format!(
                        "a topic needs 1 to {} partitions, not {partitions}",
                        i32::MAX
                    ),
                })
            }
        };
        let mut tx = self.pool.begin().await.map_err(transport)?;
        // A concurrent creator makes this wait for its commit, then do nothing; the SELECT
        // below then sees whichever count won.
        sqlx::query(
            "INSERT INTO entrega_topics (topic, partitions, created_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (topic) DO NOTHING",
        )
        .bind(topic)
        .bind(wanted)
        .bind(self.clock.now_ms())
        .execute(&mut *tx)
        .await
        .map_err(transport)?;
        let actual: i32 =
            sqlx::query_scalar("SELECT partitions FROM entrega_topics WHERE topic = $1")
                .bind(topic)
                .fetch_one(&mut *tx)
                .await
                .map_err(transport)?;
        sqlx::query(
            "INSERT INTO entrega_partitions (topic, partition_no)
             SELECT $1, p FROM generate_series(0, $2 - 1) AS p
             ON CONFLICT (topic, partition_no) DO NOTHING",
        )
        .bind(topic)
        .bind(actual)
        .execute(&mut *tx)
        .await
        .map_err(transport)?;
        tx.commit().await.map_err(transport)?;
        let actual = u32::try_from(actual).unwrap_or(partitions);
        self.remember(topic, actual);
        Ok(actual)
    }
}

#[async_trait]
impl TopicAdmin for PgLog {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        if let Some(n) = self.partitions_of(topic).await? {
            return Ok(n);
        }
        self.create_topic(topic, partitions).await
    }
}
