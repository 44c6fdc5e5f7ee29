//! Parking for ordered retries on SQLite (`entrega_aparcados`, inbox set).

use async_trait::async_trait;
use entrega_core::{Headers, ParkedAt, ParkedRecord, ParkingStore, StoreError};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;

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

fn decode(row: &SqliteRow) -> Result<ParkedRecord, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        table: "entrega_aparcados",
        reason,
    };
    let headers: String = row.try_get("cabeceras").map_err(classify)?;
    let partition: i64 = row.try_get("particion").map_err(classify)?;
    let attempts: i64 = row.try_get("intentos").map_err(classify)?;
    Ok(ParkedRecord {
        group: row.try_get("grupo").map_err(classify)?,
        topic: row.try_get("topico").map_err(classify)?,
        partition: u32::try_from(partition).map_err(|e| corrupt(format!("particion: {e}")))?,
        offset: row.try_get("desplazamiento").map_err(classify)?,
        key: row.try_get("clave").map_err(classify)?,
        headers: Headers::from_json(&headers).map_err(|e| corrupt(format!("cabeceras: {e}")))?,
        payload: row.try_get("carga").map_err(classify)?,
        attempts: u32::try_from(attempts).map_err(|e| corrupt(format!("intentos: {e}")))?,
        not_before_ms: row.try_get("no_antes_ms").map_err(classify)?,
        last_error: row.try_get("ultimo_error").map_err(classify)?,
        parked_at_ms: row.try_get("aparcado_ms").map_err(classify)?,
    })
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
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM entrega_aparcados
             WHERE grupo = ?1 AND topico = ?2 AND particion = ?3 AND clave IS ?4
             ORDER BY desplazamiento LIMIT 1"
        ))
        .bind(at.group)
        .bind(at.topic)
        .bind(partition_of(at.partition))
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(classify)?;
        row.as_ref().map(decode).transpose()
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
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM entrega_aparcados WHERE grupo = ?1 AND topico = ?2
             ORDER BY particion, desplazamiento LIMIT ?3"
        ))
        .bind(group)
        .bind(topic)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        rows.iter().map(decode).collect()
    }
}
