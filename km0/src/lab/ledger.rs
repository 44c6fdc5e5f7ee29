//! What one side of a scenario did, read from its rows: orders placed, effects applied, and
//! what went wrong (lost, applied twice, out of order, stuck), with what the fault did.

use serde::Serialize;

/// One side's count, read from the real rows after the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    /// Orders (or payments, or sales) the workload placed.
    pub placed: u64,
    /// Effects applied, repeats included (rows in the effect table).
    pub applied: u64,
    /// Placed and never applied.
    pub lost: u64,
    /// Applied more than once (each extra application counts).
    pub doubled: u64,
    /// Applied after a later event of the same key.
    pub out_of_order: u64,
    /// Still waiting when the run ended (not applied, not dead-lettered).
    pub stuck: u64,
    /// Applied, but only after waiting for a failing message ahead of it to succeed.
    pub held_up: u64,
    /// Effects of orders that were never placed (an event whose transaction rolled back).
    pub ghosts: u64,
    /// Effects applied with a wrong value (a field read with a meaning it no longer has).
    pub wrong: u64,
    /// What the injected fault did, in words (e.g. "consumer killed 3 times between ...").
    pub fault: String,
}

impl Ledger {
    /// Whether anything went wrong: lost, doubled, out of order, stuck, held up, a ghost or
    /// a wrong value.
    pub fn failed(&self) -> bool {
        self.lost
            + self.doubled
            + self.out_of_order
            + self.stuck
            + self.held_up
            + self.ghosts
            + self.wrong
            > 0
    }

    /// The ledger of `placed` orders whose effects, one row per application, name these
    /// orders: `applied` in the order they were applied.
    pub fn from_effects(placed: &[String], applied: &[String]) -> Self {
        let mut times: std::collections::HashMap<&str, u64> =
            placed.iter().map(|p| (p.as_str(), 0)).collect();
        for order in applied {
            *times.entry(order.as_str()).or_insert(0) += 1;
        }
        let lost = times.values().filter(|n| **n == 0).count() as u64;
        let doubled = times.values().map(|n| n.saturating_sub(1)).sum();
        Self {
            placed: placed.len() as u64,
            applied: applied.len() as u64,
            lost,
            doubled,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn lost_and_doubled_are_counted_from_the_applied_rows() {
        let placed = ids(&["P-1", "P-2", "P-3"]);
        let ledger = Ledger::from_effects(&placed, &ids(&["P-1", "P-1", "P-1", "P-3"]));
        assert_eq!(
            (ledger.placed, ledger.applied, ledger.lost, ledger.doubled),
            (3, 4, 1, 2)
        );
        assert!(ledger.failed());
        let clean = Ledger::from_effects(&placed, &placed);
        assert!(!clean.failed());
    }
}
