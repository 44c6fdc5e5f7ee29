//! [`LogInspector`] for the log in the database: positions read straight from its tables.

use async_trait::async_trait;
use entrega_core::{LogInspector, Record, TransportError};

use super::PgLog;

#[async_trait]
impl LogInspector for PgLog {
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(PgLog::end_offsets(self, topic).await?)
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(PgLog::committed(self, group, topic).await?)
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        Ok(PgLog::read(self, topic, partition, from, max).await?)
    }
}
