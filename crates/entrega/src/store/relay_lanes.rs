//! Relay lanes shared among relay instances by fenced leases (`entrega_relay_lanes`,
//! `entrega_relay_instances`, outbox migration set), balanced as every lease is
//! ([`super::leases`]).

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Holder, LaneLease, LaneLeases, StoreError};

use super::leases::{balance, release, LeaseTable};
use super::outbox::DbOutbox;

/// The relay's lanes, shared among every live relay instance.
const LANES: LeaseTable<'static> = LeaseTable {
    leases: "entrega_relay_lanes",
    slot: "lane",
    members: "entrega_relay_instances",
    member: "owner",
    scope: &[],
};

#[async_trait]
impl LaneLeases for DbOutbox {
    async fn balance(
        &self,
        owner: &Holder,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<Vec<LaneLease>, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4);
        let mut tx = self.db().begin().await?;
        let held = balance(&mut tx, &LANES, owner, now_ms, ttl_ms).await?;
        tx.commit().await?;
        Ok(held
            .into_iter()
            .map(|h| LaneLease {
                lane: h.slot,
                owner: owner.name.clone(),
                token: h.token,
                expires_at_ms: h.expires_at_ms,
            })
            .collect())
    }

    async fn release_all(&self, owner: &Holder) -> Result<(), StoreError> {
        let mut tx = self.db().begin().await?;
        release(&mut tx, &LANES, owner).await?;
        tx.commit().await
    }
}
