//! The one balancing rule used for every lease-shared resource (relay lanes, log partitions),
//! written once so every backend shares it and it can be tested without a database.
//!
//! Each live member aims to hold `ceil(slots / live members)` slots. It keeps (renews) what it
//! holds, takes free or expired slots up to that share, and gives back surplus so a newcomer
//! can take it. Members converge within one lease period of a join or a death.
//!
//! A member is a [`Holder`]: a stable name and the incarnation (one life of the process) using
//! it. A restarted process that keeps its name takes back the slots of its earlier life at
//! once, without waiting for their leases to end; taking bumps their tokens, so a late write
//! of the earlier life is fenced out. Only a later incarnation reclaims: an earlier one that is
//! still running finds itself superseded and holds nothing, so two processes given the same
//! name never hold a slot at once.

use std::sync::atomic::{AtomicI64, Ordering};

/// A member of a lease-shared resource: its name and this life of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The member's name, stable across restarts when the operator gives it one.
    pub name: String,
    /// This life of the member: larger for a later start.
    pub incarnation: i64,
}

impl Holder {
    /// `name` in a new life started at `now_ms`: its incarnation is the start in microseconds
    /// plus a random part below a millisecond, so a restart on a clock that did not go back
    /// orders after the life before it, and two processes starting within one millisecond
    /// still differ. Within one process every new life orders after the ones before it.
    pub fn new(name: impl Into<String>, now_ms: i64) -> Self {
        static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
        let random = i64::try_from(uuid::Uuid::new_v4().as_u128() % 1_000).unwrap_or(0);
        let candidate = now_ms.saturating_mul(1_000).saturating_add(random);
        let previous = LAST
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                Some(candidate.max(last.saturating_add(1)))
            })
            .unwrap_or(i64::MIN);
        Self {
            name: name.into(),
            incarnation: candidate.max(previous.saturating_add(1)),
        }
    }

    /// `name` with a given incarnation (tests, tools).
    pub fn with_incarnation(name: impl Into<String>, incarnation: i64) -> Self {
        Self {
            name: name.into(),
            incarnation,
        }
    }
}

/// A slot (lane or partition) as stored, before balancing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLease {
    /// Lane or partition number.
    pub slot: u32,
    /// Current holder's name, if any.
    pub owner: Option<String>,
    /// The incarnation of the holder that took it (0 before incarnations were recorded).
    pub incarnation: i64,
    /// Fencing token; incremented on every change of holder.
    pub token: i64,
    /// Expiry in epoch ms.
    pub expires_at_ms: i64,
}

impl SlotLease {
    fn named(&self, me: &Holder) -> bool {
        self.owner.as_deref() == Some(me.name.as_str())
    }

    /// Whether this life of `me` holds the slot.
    pub fn held_by(&self, me: &Holder) -> bool {
        self.named(me) && self.incarnation == me.incarnation
    }
}

/// What a member must write after balancing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalancePlan {
    /// Slots the member holds and keeps: extend their expiry, token unchanged.
    pub renew: Vec<u32>,
    /// Slots to take: free or expired ones, and those of an earlier incarnation of the member.
    /// Set owner and incarnation, increment token, set expiry.
    pub take: Vec<u32>,
    /// Slots to give back: clear owner (token unchanged, so a late writer stays fenced out
    /// once the next holder increments it).
    pub release: Vec<u32>,
    /// A later incarnation of the member holds slots: this one gives back what it holds and
    /// takes nothing.
    pub superseded: bool,
}

impl BalancePlan {
    /// Slots held after the plan is applied.
    pub fn held(&self) -> Vec<u32> {
        let mut held: Vec<u32> = self.renew.iter().chain(&self.take).copied().collect();
        held.sort_unstable();
        held
    }

    /// Writes the plan into `leases` as `me` would, with `expires_at_ms` for what it takes or
    /// renews: the in-memory stores' version of the store's writes.
    pub fn apply(&self, leases: &mut [SlotLease], me: &Holder, expires_at_ms: i64) {
        for l in leases.iter_mut() {
            if self.take.contains(&l.slot) {
                l.owner = Some(me.name.clone());
                l.incarnation = me.incarnation;
                l.token += 1;
                l.expires_at_ms = expires_at_ms;
            } else if self.renew.contains(&l.slot) {
                l.expires_at_ms = expires_at_ms;
            } else if self.release.contains(&l.slot) {
                l.owner = None;
                l.expires_at_ms = 0;
            }
        }
    }
}

/// Fair share of `slots` among `live_members` (at least one: the caller).
pub fn fair_share(slots: usize, live_members: usize) -> usize {
    slots.div_ceil(live_members.max(1))
}

/// Computes `me`'s plan from the current leases, at `now_ms`, with `live_members` counting
/// every member seen within the lease period (including `me`; the lives of one name count
/// once).
pub fn plan_balance(
    me: &Holder,
    leases: &[SlotLease],
    live_members: usize,
    now_ms: i64,
) -> BalancePlan {
    let mine: Vec<u32> = leases
        .iter()
        .filter(|l| l.held_by(me))
        .map(|l| l.slot)
        .collect();
    if leases
        .iter()
        .any(|l| l.named(me) && l.incarnation > me.incarnation)
    {
        return BalancePlan {
            release: mine,
            superseded: true,
            ..BalancePlan::default()
        };
    }
    let share = fair_share(leases.len(), live_members);
    let mut plan = BalancePlan::default();
    if mine.len() > share {
        // Keep the lowest-numbered slots; sticky enough and deterministic.
        plan.renew = mine[..share].to_vec();
        plan.release = mine[share..].to_vec();
        return plan;
    }
    plan.renew = mine;
    let wanted = share - plan.renew.len();
    // An earlier life's slots first (they are this member's already), then free or expired.
    let earlier = leases
        .iter()
        .filter(|l| l.named(me) && l.incarnation < me.incarnation);
    let open = leases
        .iter()
        .filter(|l| !l.named(me))
        .filter(|l| l.owner.is_none() || l.expires_at_ms <= now_ms);
    plan.take = earlier.chain(open).take(wanted).map(|l| l.slot).collect();
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
                incarnation: 0,
                token: 0,
                expires_at_ms: 0,
            })
            .collect()
    }

    fn holder(name: &str) -> Holder {
        Holder::with_incarnation(name, 1)
    }

    fn apply(leases: &mut [SlotLease], me: &Holder, plan: &BalancePlan, expiry: i64) {
        plan.apply(leases, me, expiry);
    }

    #[test]
    fn a_lone_member_takes_everything() {
        let plan = plan_balance(&holder("a"), &free(8), 1, 0);
        assert_eq!(plan.take.len(), 8);
    }

    #[test]
    fn three_members_converge_to_disjoint_fair_shares() {
        let mut leases = free(64);
        for _round in 0..3 {
            for m in ["a", "b", "c"] {
                let m = holder(m);
                let plan = plan_balance(&m, &leases, 3, 1_000);
                apply(&mut leases, &m, &plan, 10_000);
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
        let (dead, b) = (holder("dead"), holder("b"));
        let plan = plan_balance(&dead, &leases, 1, 0);
        apply(&mut leases, &dead, &plan, 5_000);
        assert!(plan_balance(&b, &leases, 1, 4_999).take.is_empty());
        let plan = plan_balance(&b, &leases, 1, 5_000);
        assert_eq!(plan.take, vec![0, 1, 2, 3]);
        apply(&mut leases, &b, &plan, 9_000);
        assert!(
            leases.iter().all(|l| l.token == 2),
            "takeover must bump the fencing token"
        );
    }

    #[test]
    fn a_later_life_of_a_name_takes_its_slots_back_at_once_and_fences_the_earlier() {
        let mut leases = free(6);
        let (first, other) = (Holder::with_incarnation("r", 10), holder("o"));
        for m in [&first, &other] {
            let plan = plan_balance(m, &leases, 2, 0);
            apply(&mut leases, m, &plan, 10_000);
        }
        let before: Vec<i64> = leases.iter().map(|l| l.token).collect();
        // The restart, long before the earlier life's leases end.
        let second = Holder::with_incarnation("r", 11);
        let plan = plan_balance(&second, &leases, 2, 1_000);
        assert_eq!(
            plan.take,
            vec![0, 1, 2],
            "its earlier life's slots, nothing else"
        );
        assert!(!plan.superseded);
        apply(&mut leases, &second, &plan, 11_000);
        for slot in 0..3 {
            assert_eq!(leases[slot].token, before[slot] + 1, "slot {slot} fenced");
        }
        assert!(leases[3..].iter().all(|l| l.owner.as_deref() == Some("o")));
        // The earlier life, if it still runs, holds nothing and takes nothing back.
        let stale = plan_balance(&first, &leases, 2, 2_000);
        assert!(stale.superseded);
        assert!(stale.take.is_empty() && stale.renew.is_empty() && stale.release.is_empty());
        // The later life renews what it took.
        assert_eq!(
            plan_balance(&second, &leases, 2, 3_000).renew,
            vec![0, 1, 2]
        );
    }

    #[test]
    fn a_superseded_life_gives_back_what_it_still_holds() {
        let mut leases = free(4);
        let (old, new) = (
            Holder::with_incarnation("r", 5),
            Holder::with_incarnation("r", 6),
        );
        let plan = plan_balance(&old, &leases, 1, 0);
        apply(&mut leases, &old, &plan, 10_000);
        // The later life took slot 0 only (another member came and went meanwhile).
        leases[0].incarnation = 6;
        leases[0].token += 1;
        let plan = plan_balance(&old, &leases, 1, 100);
        assert!(plan.superseded);
        assert_eq!(plan.release, vec![1, 2, 3]);
        assert!(plan.held().is_empty());
        assert_eq!(plan_balance(&new, &leases, 1, 100).take, vec![1, 2, 3]);
    }

    #[test]
    fn incarnations_of_later_starts_are_larger() {
        let a = Holder::new("r", 1_000);
        let b = Holder::new("r", 1_001);
        assert!(b.incarnation > a.incarnation);
        // In one process, a life started in the same millisecond still orders after.
        let c = Holder::new("r", 1_001);
        assert!(c.incarnation > b.incarnation);
    }
}
