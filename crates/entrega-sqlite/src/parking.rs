//! Parking for ordered retries on SQLite (`entrega_aparcados`, inbox set).

use async_trait::async_trait;
use entrega_core::{ParkedAt, ParkedRecord, ParkedRow, ParkingStore, StoreError};
use sqlx::sqlite::SqlitePool;

use crate::connect::begin_immediate;
use crate::errors::classify;

const COLUMNS: &str = "grupo, topico, particion, desplazamiento, clave, cabeceras, carga, \
                       intentos, no_antes_ms, ultimo_error, aparcado_ms";

/// [`ParkingStore`] in the consumer's SQLite database; needs the inbox migration set.
#[derive(Debug, Clone)]
pub struct SqliteParking {
    pool: SqlitePool,
}

impl SqliteParking {
    /// Parking in the database behind `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }
}

fn partition_of(p: u32) -> i64 {
    i64::from(p)
}

/// The columns of `entrega_aparcados` every query below selects, in [`ParkedRow`] order.
const SELECTED: &str = "grupo, topico, particion, desplazamiento, clave, cabeceras, carga, \
                      intentos, no_antes_ms, ultimo_error, aparcado_ms";

fn decode(rows: Vec<ParkedRow>) -> Result<Vec<ParkedRecord>, StoreError> {
    rows.into_iter()
        .map(|row| ParkedRecord::from_stored(row.into()))
        .collect()
}

#[async_trait]
impl ParkingStore for SqliteParking {
    async fn park(&self, records: &[ParkedRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut tx = begin_immediate(&self.pool).await?;
        for r in records {
            sqlx::query(&format!(
                "INSERT INTO entrega_aparcados ({COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT DO NOTHING"
            ))
            .bind(&r.group)
            .bind(&r.topic)
            .bind(partition_of(r.partition))
            .bind(r.offset)
            .bind(&r.key)
            .bind(r.headers.to_json())
            .bind(&r.payload)
            .bind(i64::from(r.attempts))
            .bind(r.not_before_ms)
            .bind(&r.last_error)
            .bind(r.parked_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        }
        tx.commit().await.map_err(classify)
    }

    async fn parked_keys(&self, at: ParkedAt<'_>) -> Result<Vec<Option<String>>, StoreError> {
        sqlx::query_scalar(
            "SELECT DISTINCT clave FROM entrega_aparcados
             WHERE grupo = ?1 AND topico = ?2 AND particion = ?3",
        )
        .bind(at.group)
        .bind(at.topic)
        .bind(partition_of(at.partition))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)
    }

    async fn head(
        &self,
        at: ParkedAt<'_>,
        key: Option<&str>,
    ) -> Result<Option<ParkedRecord>, StoreError> {
        let rows: Vec<ParkedRow> = sqlx::query_as(&format!(
            "SELECT {SELECTED} FROM entrega_aparcados
             WHERE grupo = ?1 AND topico = ?2 AND particion = ?3 AND clave IS ?4
             ORDER BY desplazamiento LIMIT 1"
        ))
        .bind(at.group)
        .bind(at.topic)
        .bind(partition_of(at.partition))
        .bind(key)
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        Ok(decode(rows)?.pop())
    }

    async fn reschedule(
        &self,
        at: ParkedAt<'_>,
        offset: i64,
        attempts: u32,
        not_before_ms: i64,
        last_error: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE entrega_aparcados SET intentos = ?5, no_antes_ms = ?6, ultimo_error = ?7
             WHERE grupo = ?1 AND topico = ?2 AND particion = ?3 AND desplazamiento = ?4",
        )
        .bind(at.group)
        .bind(at.topic)
        .bind(partition_of(at.partition))
        .bind(offset)
        .bind(i64::from(attempts))
        .bind(not_before_ms)
        .bind(last_error)
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(())
    }

    async fn remove(&self, at: ParkedAt<'_>, offset: i64) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM entrega_aparcados
             WHERE grupo = ?1 AND topico = ?2 AND particion = ?3 AND desplazamiento = ?4",
        )
        .bind(at.group)
        .bind(at.topic)
        .bind(partition_of(at.partition))
        .bind(offset)
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(())
    }

    async fn list(
        &self,
        group: &str,
        topic: &str,
        limit: usize,
    ) -> Result<Vec<ParkedRecord>, StoreError> {
        let rows: Vec<ParkedRow> = sqlx::query_as(&format!(
            "SELECT {SELECTED} FROM entrega_aparcados WHERE grupo = ?1 AND topico = ?2
             ORDER BY particion, desplazamiento LIMIT ?3"
        ))
        .bind(group)
        .bind(topic)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        decode(rows)
    }
}
