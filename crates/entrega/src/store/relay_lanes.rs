//! Relay lanes shared among relay instances by fenced leases (`entrega_relay_lanes`,
//! `entrega_relay_instances`, outbox migration set).
//!
//! One `balance` is one write transaction: read every lane (locked: SQLite's write
//! transaction locks the database from its start, PostgreSQL locks the lane rows in lane
//! order), heartbeat, compute the plan with [`plan_balance`], write it. Two instances never
//! plan from the same picture, so they never take the same lane, and taking a lane bumps its
//! token, which fences out any late write of the previous holder.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{plan_balance, LaneLease, LaneLeases, SlotLease, StoreError};

use super::outbox::DbOutbox;
use crate::db::{query, query_each, IntList};

/// `lane, owner, token, expires_at_ms`.
type LaneRow = (i64, Option<String>, i64, i64);

/// Lease duration in ms, saturating for absurd values.
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4)
}

fn lane_of(row: i64) -> Result<u32, StoreError> {
    u32::try_from(row).map_err(|_| StoreError::Corrupt {
        table: "entrega_relay_lanes",
        reason: format!("lane {row} out of range"),
    })
}

fn lanes(slots: &[u32]) -> IntList {
    IntList(slots.iter().map(|&s| i64::from(s)).collect())
}

#[async_trait]
impl LaneLeases for DbOutbox {
    async fn balance(
        &self,
        owner: &str,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<Vec<LaneLease>, StoreError> {
        let ttl = ttl_ms(ttl);
        let expires = now_ms.saturating_add(ttl);
        let mut tx = self.db().begin().await?;
        let rows: Vec<LaneRow> = tx
            .fetch_all(query_each(
                "SELECT CAST(lane AS BIGINT), owner, token, expires_at_ms FROM entrega_relay_lanes
                 ORDER BY lane",
                "SELECT CAST(lane AS BIGINT), owner, token, expires_at_ms FROM entrega_relay_lanes
                 ORDER BY lane FOR UPDATE",
            ))
            .await?;
        let leases = rows
            .into_iter()
            .map(|(lane, owner, token, expires_at_ms)| {
                Ok(SlotLease {
                    slot: lane_of(lane)?,
                    owner,
                    token,
                    expires_at_ms,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // Under the lane locks, so instance bookkeeping is serialised too. Instances silent
        // for a whole lease period are gone: they no longer count for the fair share (their
        // lanes free up as their leases expire).
        tx.execute(
            query(
                "INSERT INTO entrega_relay_instances (owner, seen_at_ms) VALUES ($1, $2)
                 ON CONFLICT (owner) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
            )
            .bind(owner)
            .bind(now_ms),
        )
        .await?;
        tx.execute(
            query("DELETE FROM entrega_relay_instances WHERE seen_at_ms <= $1")
                .bind(now_ms.saturating_sub(ttl)),
        )
        .await?;
        let live: Option<i64> = tx
            .scalar(query("SELECT COUNT(*) FROM entrega_relay_instances"))
            .await?;
        let live = live
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(1)
            .max(1);
        let plan = plan_balance(owner, &leases, live, now_ms);

        tx.execute(
            query_each(
                "UPDATE entrega_relay_lanes SET owner = NULL, expires_at_ms = 0
                 WHERE owner = $2 AND lane IN (SELECT value FROM json_each($1))",
                "UPDATE entrega_relay_lanes SET owner = NULL, expires_at_ms = 0
                 WHERE owner = $2 AND lane = ANY($1)",
            )
            .bind(lanes(&plan.release))
            .bind(owner),
        )
        .await?;
        tx.execute(
            query_each(
                "UPDATE entrega_relay_lanes SET expires_at_ms = $3
                 WHERE owner = $2 AND lane IN (SELECT value FROM json_each($1))",
                "UPDATE entrega_relay_lanes SET expires_at_ms = $3
                 WHERE owner = $2 AND lane = ANY($1)",
            )
            .bind(lanes(&plan.renew))
            .bind(owner)
            .bind(expires),
        )
        .await?;
        tx.execute(
            query_each(
                "UPDATE entrega_relay_lanes SET owner = $2, token = token + 1, expires_at_ms = $3
                 WHERE lane IN (SELECT value FROM json_each($1))",
                "UPDATE entrega_relay_lanes SET owner = $2, token = token + 1, expires_at_ms = $3
                 WHERE lane = ANY($1)",
            )
            .bind(lanes(&plan.take))
            .bind(owner)
            .bind(expires),
        )
        .await?;
        let held: Vec<(i64, i64, i64)> = tx
            .fetch_all(
                query(
                    "SELECT CAST(lane AS BIGINT), token, expires_at_ms FROM entrega_relay_lanes
                     WHERE owner = $1 ORDER BY lane",
                )
                .bind(owner),
            )
            .await?;
        tx.commit().await?;
        held.into_iter()
            .map(|(lane, token, expires_at_ms)| {
                Ok(LaneLease {
                    lane: lane_of(lane)?,
                    owner: owner.to_owned(),
                    token,
                    expires_at_ms,
                })
            })
            .collect()
    }

    async fn release_all(&self, owner: &str) -> Result<(), StoreError> {
        let mut tx = self.db().begin().await?;
        // The token stays: the next holder increments it, which fences any late write of ours.
        tx.execute(
            query(
                "UPDATE entrega_relay_lanes SET owner = NULL, expires_at_ms = 0 WHERE owner = $1",
            )
            .bind(owner),
        )
        .await?;
        tx.execute(query("DELETE FROM entrega_relay_instances WHERE owner = $1").bind(owner))
            .await?;
        tx.commit().await
    }
}
