//! [`LogInspector`] for the log in the database: positions read straight from its tables.

use async_trait::async_trait;
use entrega_core::{LogInspector, Record, TransportError};

use super::SqliteLog;

#[async_trait]
impl LogInspector for SqliteLog {
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(SqliteLog::end_offsets(self, topic).await?)
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(SqliteLog::committed(self, group, topic).await?)
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        Ok(SqliteLog::read(self, topic, partition, from, max).await?)
    }
}
