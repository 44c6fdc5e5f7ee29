//! Relay lanes shared among relay instances by fenced leases.
//!
//! One `balance` is one `BEGIN IMMEDIATE` transaction: heartbeat, read every lane, compute the
//! plan with [`plan_balance`], write it. Holding the write lock for the whole round means two
//! instances never plan from the same snapshot, so they never take the same lane.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{plan_balance, LaneLease, LaneLeases, SlotLease, StoreError};
use sqlx::{Row, SqliteConnection};

use crate::connect::begin_immediate;
use crate::errors::{classify, corrupt};
use crate::outbox::SqliteOutbox;

/// A list of slot numbers as a JSON array, for `IN (SELECT value FROM json_each(?))`.
pub(crate) fn json_slots(slots: &[u32]) -> String {
    serde_json::Value::from(slots.to_vec()).to_string()
}

/// Lease duration in ms, saturating instead of overflowing on absurd TTLs.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2)
}

fn slot(value: i64, table: &'static str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| corrupt(table, format!("slot number {value} out of range")))
}

async fn read_lanes(conn: &mut SqliteConnection) -> Result<Vec<SlotLease>, StoreError> {
    let rows = sqlx::query(
        "SELECT lane, owner, token, expires_at_ms FROM entrega_relay_lanes ORDER BY lane",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(classify)?;
    let get_err = |e: sqlx::Error| corrupt("entrega_relay_lanes", e);
    rows.iter()
        .map(|row| {
            Ok(SlotLease {
                slot: slot(row.try_get("lane").map_err(get_err)?, "entrega_relay_lanes")?,
                owner: row.try_get("owner").map_err(get_err)?,
                token: row.try_get("token").map_err(get_err)?,
                expires_at_ms: row.try_get("expires_at_ms").map_err(get_err)?,
            })
        })
        .collect()
}

#[async_trait]
impl LaneLeases for SqliteOutbox {
    async fn balance(
        &self,
        owner: &str,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<Vec<LaneLease>, StoreError> {
        let ttl = ttl_ms(ttl);
        let expires = now_ms.saturating_add(ttl);
        let mut tx = begin_immediate(&self.pool).await?;
        sqlx::query(
            "INSERT INTO entrega_relay_instances (owner, seen_at_ms) VALUES (?, ?)
             ON CONFLICT (owner) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
        )
        .bind(owner)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        // Instances silent for a whole lease period are gone; they no longer count for the
        // fair share (their lanes free up as their leases expire).
        sqlx::query("DELETE FROM entrega_relay_instances WHERE seen_at_ms <= ? AND owner <> ?")
            .bind(now_ms.saturating_sub(ttl))
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM entrega_relay_instances")
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        let lanes = read_lanes(&mut tx).await?;
        let live = usize::try_from(live).unwrap_or(1);
        let plan = plan_balance(owner, &lanes, live, now_ms);

        sqlx::query(
            "UPDATE entrega_relay_lanes SET expires_at_ms = ?
             WHERE owner = ? AND lane IN (SELECT value FROM json_each(?))",
        )
        .bind(expires)
        .bind(owner)
        .bind(json_slots(&plan.renew))
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        sqlx::query(
            "UPDATE entrega_relay_lanes SET owner = ?, token = token + 1, expires_at_ms = ?
             WHERE lane IN (SELECT value FROM json_each(?))",
        )
        .bind(owner)
        .bind(expires)
        .bind(json_slots(&plan.take))
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        sqlx::query(
            "UPDATE entrega_relay_lanes SET owner = NULL
             WHERE owner = ? AND lane IN (SELECT value FROM json_each(?))",
        )
        .bind(owner)
        .bind(json_slots(&plan.release))
        .execute(&mut *tx)
        .await
        .map_err(classify)?;

        let held = read_lanes(&mut tx)
            .await?
            .into_iter()
            .filter(|l| l.owner.as_deref() == Some(owner))
            .map(|l| LaneLease {
                lane: l.slot,
                owner: owner.to_owned(),
                token: l.token,
                expires_at_ms: l.expires_at_ms,
            })
            .collect();
        tx.commit().await.map_err(classify)?;
        Ok(held)
    }

    async fn release_all(&self, owner: &str) -> Result<(), StoreError> {
        let mut tx = begin_immediate(&self.pool).await?;
        // The token stays: the next holder increments it, which fences any late write of ours.
        sqlx::query("UPDATE entrega_relay_lanes SET owner = NULL WHERE owner = ?")
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        sqlx::query("DELETE FROM entrega_relay_instances WHERE owner = ?")
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }
}
