//! Relay lane leases: which relay instance publishes which lanes, fenced by tokens.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{plan_balance, LaneLease, LaneLeases, SlotLease, StoreError};
use sqlx::postgres::PgConnection;
use sqlx::Row;

use crate::errors::classify;
use crate::PgOutbox;

/// Lease duration in ms, saturating for absurd values.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Slot numbers as stored (INT columns).
pub(crate) fn slots_i32(slots: &[u32]) -> Vec<i32> {
    slots
        .iter()
        .filter_map(|s| i32::try_from(*s).ok())
        .collect()
}

#[async_trait]
impl LaneLeases for PgOutbox {
    async fn balance(
        &self,
        owner: &str,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<Vec<LaneLease>, StoreError> {
        let ttl = ttl_ms(ttl);
        let expires = now_ms.saturating_add(ttl);
        let mut tx = self.pool.begin().await.map_err(classify)?;
        // Locking every lane row serialises balancing instances: each one plans on a
        // settled picture, and lanes are always locked in the same order (no deadlock).
        let rows = sqlx::query(
            "SELECT lane, owner, token, expires_at_ms FROM entrega_relay_lanes
             ORDER BY lane FOR UPDATE",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            let lane: i32 = row.try_get("lane").map_err(classify)?;
            leases.push(SlotLease {
                slot: u32::try_from(lane).map_err(|_| StoreError::Corrupt {
                    table: "entrega_relay_lanes",
                    reason: format!("negative lane {lane}"),
                })?,
                owner: row.try_get("owner").map_err(classify)?,
                token: row.try_get("token").map_err(classify)?,
                expires_at_ms: row.try_get("expires_at_ms").map_err(classify)?,
            });
        }
        // Under the lane locks, so instance bookkeeping is serialised too.
        heartbeat(&mut tx, owner, now_ms, ttl).await?;
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM entrega_relay_instances WHERE seen_at_ms > $1",
        )
        .bind(now_ms - ttl)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
        let live = usize::try_from(live).unwrap_or(1).max(1);
        let plan = plan_balance(owner, &leases, live, now_ms);

        sqlx::query(
            "UPDATE entrega_relay_lanes SET owner = NULL, expires_at_ms = 0
             WHERE lane = ANY($1) AND owner = $2",
        )
        .bind(slots_i32(&plan.release))
        .bind(owner)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        sqlx::query(
            "UPDATE entrega_relay_lanes SET expires_at_ms = $3
             WHERE lane = ANY($1) AND owner = $2",
        )
        .bind(slots_i32(&plan.renew))
        .bind(owner)
        .bind(expires)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        // Taking a lane bumps its token, fencing out whoever held it before.
        sqlx::query(
            "UPDATE entrega_relay_lanes SET owner = $2, token = token + 1, expires_at_ms = $3
             WHERE lane = ANY($1)",
        )
        .bind(slots_i32(&plan.take))
        .bind(owner)
        .bind(expires)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        let held = sqlx::query(
            "SELECT lane, token FROM entrega_relay_lanes WHERE owner = $1 ORDER BY lane",
        )
        .bind(owner)
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)?;

        let mut out = Vec::with_capacity(held.len());
        for row in &held {
            let lane: i32 = row.try_get("lane").map_err(classify)?;
            out.push(LaneLease {
                lane: u32::try_from(lane).unwrap_or_default(),
                owner: owner.to_owned(),
                token: row.try_get("token").map_err(classify)?,
                expires_at_ms: expires,
            });
        }
        Ok(out)
    }

    async fn release_all(&self, owner: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        sqlx::query(
            "UPDATE entrega_relay_lanes SET owner = NULL, expires_at_ms = 0 WHERE owner = $1",
        )
        .bind(owner)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        sqlx::query("DELETE FROM entrega_relay_instances WHERE owner = $1")
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }
}

/// Records that `owner` is alive and forgets instances silent for longer than the lease.
async fn heartbeat(
    conn: &mut PgConnection,
    owner: &str,
    now_ms: i64,
    ttl: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO entrega_relay_instances (owner, seen_at_ms) VALUES ($1, $2)
         ON CONFLICT (owner) DO UPDATE SET seen_at_ms = EXCLUDED.seen_at_ms",
    )
    .bind(owner)
    .bind(now_ms)
    .execute(&mut *conn)
    .await
    .map_err(classify)?;
    sqlx::query("DELETE FROM entrega_relay_instances WHERE seen_at_ms <= $1")
        .bind(now_ms - ttl)
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
    Ok(())
}
