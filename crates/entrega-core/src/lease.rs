//! The one balancing rule used for every lease-shared resource (relay lanes, log partitions),
//! written once so every backend shares it and it can be tested without a database.
//!
//! Each live member aims to hold `ceil(slots / live members)` slots. It keeps (renews) what it
//! holds, takes free or expired slots up to that share, and gives back surplus so a newcomer
//! can take it. Members converge within one lease period of a join or a death.

/// A slot (lane or partition) as stored, before balancing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLease {
    /// Lane or partition number.
    pub slot: u32,
    /// Current holder, if any.
    pub owner: Option<String>,
    /// Fencing token; incremented on every change of holder.
    pub token: i64,
    /// Expiry in epoch ms.
    pub expires_at_ms: i64,
}

/// What a member must write after balancing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalancePlan {
    /// Slots the member holds and keeps: extend their expiry, token unchanged.
    pub renew: Vec<u32>,
    /// Free or expired slots to take: set owner, increment token, set expiry.
    pub take: Vec<u32>,
    /// Slots to give back: clear owner (token unchanged, so a late writer stays fenced out
    /// once the next holder increments it).
    pub release: Vec<u32>,
}

impl BalancePlan {
    /// Slots held after the plan is applied.
    pub fn held(&self) -> Vec<u32> {
        let mut held: Vec<u32> = self.renew.iter().chain(&self.take).copied().collect();
        held.sort_unstable();
        held
    }
}

/// Fair share of `slots` among `live_members` (at least one: the caller).
pub fn fair_share(slots: usize, live_members: usize) -> usize {
    slots.div_ceil(live_members.max(1))
}

/// Computes `me`'s plan from the current leases, at `now_ms`, with `live_members` counting
/// every member seen within the lease period (including `me`).
pub fn plan_balance(
    me: &str,
    leases: &[SlotLease],
    live_members: usize,
    now_ms: i64,
) -> BalancePlan {
    let share = fair_share(leases.len(), live_members);
    let mine: Vec<u32> = leases
        .iter()
        .filter(|l| l.owner.as_deref() == Some(me))
        .map(|l| l.slot)
        .collect();
    let mut plan = BalancePlan::default();
    if mine.len() > share {
        // Keep the lowest-numbered slots; sticky enough and deterministic.
        plan.renew = mine[..share].to_vec();
        plan.release = mine[share..].to_vec();
        return plan;
    }
    plan.renew = mine;
    let wanted = share - plan.renew.len();
    plan.take = leases
        .iter()
        .filter(|l| l.owner.as_deref() != Some(me))
        .filter(|l| l.owner.is_none() || l.expires_at_ms <= now_ms)
        .take(wanted)
        .map(|l| l.slot)
        .collect();
    plan
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn free(n: u32) -> Vec<SlotLease> {
        (0..n)
            .map(|slot| SlotLease {
                slot,
                owner: None,
                token: 0,
                expires_at_ms: 0,
            })
            .collect()
    }

    fn apply(leases: &mut [SlotLease], me: &str, plan: &BalancePlan, expiry: i64) {
        for l in leases.iter_mut() {
            if plan.take.contains(&l.slot) {
                l.owner = Some(me.into());
                l.token += 1;
                l.expires_at_ms = expiry;
            } else if plan.renew.contains(&l.slot) {
                l.expires_at_ms = expiry;
            } else if plan.release.contains(&l.slot) {
                l.owner = None;
            }
        }
    }

    #[test]
    fn a_lone_member_takes_everything() {
        let plan = plan_balance("a", &free(8), 1, 0);
        assert_eq!(plan.take.len(), 8);
    }

    #[test]
    fn three_members_converge_to_disjoint_fair_shares() {
        let mut leases = free(64);
        for _round in 0..3 {
            for m in ["a", "b", "c"] {
                let plan = plan_balance(m, &leases, 3, 1_000);
                apply(&mut leases, m, &plan, 10_000);
            }
        }
        for m in ["a", "b", "c"] {
            let held = leases
                .iter()
                .filter(|l| l.owner.as_deref() == Some(m))
                .count();
            assert!((20..=22).contains(&held), "{m} holds {held}");
        }
        assert!(leases.iter().all(|l| l.owner.is_some()));
    }

    #[test]
    fn a_dead_members_slots_are_taken_after_expiry_only() {
        let mut leases = free(4);
        let plan = plan_balance("dead", &leases, 1, 0);
        apply(&mut leases, "dead", &plan, 5_000);
        assert!(plan_balance("b", &leases, 1, 4_999).take.is_empty());
        let plan = plan_balance("b", &leases, 1, 5_000);
        assert_eq!(plan.take, vec![0, 1, 2, 3]);
        apply(&mut leases, "b", &plan, 9_000);
        assert!(
            leases.iter().all(|l| l.token == 2),
            "takeover must bump the fencing token"
        );
    }
}
