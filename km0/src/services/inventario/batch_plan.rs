//! The set-based batch apply, decided in memory: what each event of a batch does, given the
//! keys the batch claimed, the reservations that exist and the stock as locked for it.
//!
//! The decision walks the events in order exactly as the per-event path applies them, over
//! a running copy of the stock, so an event refused for stock sees what the events before it
//! took, and a later one that fits still applies. Nothing here touches the database: the
//! caller reads the inputs in a constant number of statements and writes the [`Plan`] in a
//! constant number more.

use std::collections::{BTreeMap, HashMap, HashSet};

use entrega::ContractError;
use entrega_core::{NewEvent, Processed, TraceContext, TRACEPARENT};

use super::db::{reservation_id, ApplyError, BatchItem};
use super::domain::{StockError, StockLine};
use super::reservations::{by_product, stock_updated, Motive};

/// What the batch reads before deciding.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Keys the batch's claim recorded just now (the others were processed before).
    pub claimed: HashSet<String>,
    /// Reservation ids (`reserva-<pedido>`) that exist, in any state.
    pub reserved: HashSet<String>,
    /// Units of every product the batch's orders name that exists, locked for the batch.
    pub stock: HashMap<String, i64>,
}

/// A reservation row to write (`reservada`, with the lines it took).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReservation {
    /// `reserva-<pedido>`.
    pub id: String,
    /// The order.
    pub order_id: String,
    /// What it took, one line per product.
    pub lines: Vec<StockLine>,
}

/// What the batch writes, and what each event gets.
#[derive(Debug, Default)]
pub struct Plan {
    /// One result per item, in order.
    pub results: Vec<Result<Processed<()>, ApplyError>>,
    /// Units to take per product (only products that change), in product order.
    pub taken: BTreeMap<String, i64>,
    /// Reservations the batch's orders made, in order.
    pub reservations: Vec<NewReservation>,
    /// `stock.actualizado` of every change, in the order the changes happened.
    pub events: Vec<StockChange>,
    /// Keys claimed for events then refused: given back, so they commit unrecorded.
    pub unclaim: Vec<String>,
}

/// A product's units moved by an order of the batch: its `stock.actualizado`
/// ([`StockChange::event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockChange {
    /// The product.
    pub product: String,
    /// Units before.
    pub before: i64,
    /// Units after.
    pub after: i64,
    /// The order that took them.
    pub order_id: String,
    /// The delivery's trace, which the event continues.
    pub trace: Option<TraceContext>,
}

impl StockChange {
    /// The change's `stock.actualizado` (taken by an order, [`Motive::Order`]).
    pub fn event(&self) -> Result<NewEvent, ContractError> {
        let event = stock_updated(
            &self.product,
            self.before,
            self.after,
            Motive::Order,
            Some(&self.order_id),
        )?;
        Ok(match self.trace {
            Some(ctx) => event.with_header(TRACEPARENT, ctx.header()),
            None => event,
        })
    }
}

/// The keys the batch's claim should try: those of the events that can be read (an
/// unreadable one keeps its key unrecorded, as on the per-event path).
pub fn candidate_keys(items: &[BatchItem]) -> Vec<&str> {
    items
        .iter()
        .filter(|i| i.order.is_ok())
        .map(|i| i.message_id.as_str())
        .collect()
}

/// The reservation ids and products the batch needs to read (sorted, distinct).
pub fn needs(items: &[BatchItem]) -> (Vec<String>, Vec<String>) {
    let mut reservations = std::collections::BTreeSet::new();
    let mut products = std::collections::BTreeSet::new();
    for order in items.iter().filter_map(|i| i.order.as_ref().ok()) {
        if order.reservation.is_some() {
            continue;
        }
        reservations.insert(reservation_id(&order.order_id));
        products.extend(order.lines.iter().map(|l| l.product.clone()));
    }
    (
        reservations.into_iter().collect(),
        products.into_iter().collect(),
    )
}

/// Decides every item in order over `inputs`.
pub fn plan(items: &[BatchItem], inputs: Inputs) -> Plan {
    let Inputs {
        claimed,
        mut reserved,
        mut stock,
    } = inputs;
    let mut plan = Plan {
        results: Vec::with_capacity(items.len()),
        ..Plan::default()
    };
    // Keys this batch recorded and kept; a later repeat in the batch is a duplicate.
    let mut kept: HashSet<&str> = HashSet::new();
    let mut refused: HashSet<&str> = HashSet::new();
    for item in items {
        let order = match &item.order {
            Ok(order) => order,
            Err(e) => {
                plan.results.push(Err(e.clone().into()));
                continue;
            }
        };
        let key = item.message_id.as_str();
        if !claimed.contains(key) || kept.contains(key) {
            plan.results.push(Ok(Processed::Duplicate));
            continue;
        }
        let id = reservation_id(&order.order_id);
        if order.reservation.is_some() || reserved.contains(&id) {
            // Taken by the saga's command, or reserved before under the same id.
            kept.insert(key);
            refused.remove(key);
            plan.results.push(Ok(Processed::Applied(())));
            continue;
        }
        let lines = by_product(&order.lines);
        if let Some(refusal) = first_short(&lines, &stock) {
            refused.insert(key);
            plan.results.push(Err(refusal.into()));
            continue;
        }
        for line in &lines {
            let quantity = i64::from(line.quantity);
            if let Some(units) = stock.get_mut(&line.product) {
                let before = *units;
                *units -= quantity;
                *plan.taken.entry(line.product.clone()).or_default() += quantity;
                plan.events.push(StockChange {
                    product: line.product.clone(),
                    before,
                    after: *units,
                    order_id: order.order_id.clone(),
                    trace: item.trace,
                });
            }
        }
        reserved.insert(id.clone());
        plan.reservations.push(NewReservation {
            id,
            order_id: order.order_id.clone(),
            lines,
        });
        kept.insert(key);
        refused.remove(key);
        plan.results.push(Ok(Processed::Applied(())));
    }
    let mut unclaim: Vec<String> = refused.into_iter().map(str::to_owned).collect();
    unclaim.sort();
    plan.unclaim = unclaim;
    plan
}

/// The first line (in order) that the stock cannot serve, as the refusal.
fn first_short(lines: &[StockLine], stock: &HashMap<String, i64>) -> Option<StockError> {
    lines
        .iter()
        .find_map(|line| match stock.get(&line.product) {
            None => Some(StockError::UnknownProduct {
                product: line.product.clone(),
            }),
            Some(units) if *units < i64::from(line.quantity) => Some(StockError::OutOfStock {
                product: line.product.clone(),
            }),
            Some(_) => None,
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::services::inventario::PlacedOrder;

    fn item(key: &str, order: &str, lines: &[(&str, i32)]) -> BatchItem {
        BatchItem {
            trace: None,
            message_id: key.to_owned(),
            order: Ok(PlacedOrder {
                order_id: order.to_owned(),
                lines: lines
                    .iter()
                    .map(|(p, q)| StockLine {
                        product: (*p).to_owned(),
                        quantity: *q,
                    })
                    .collect(),
                reservation: None,
            }),
        }
    }

    fn inputs(claimed: &[&str], stock: &[(&str, i64)]) -> Inputs {
        Inputs {
            claimed: claimed.iter().map(|k| (*k).to_owned()).collect(),
            reserved: HashSet::new(),
            stock: stock.iter().map(|(p, u)| ((*p).to_owned(), *u)).collect(),
        }
    }

    fn outcome(r: &Result<Processed<()>, ApplyError>) -> String {
        match r {
            Ok(Processed::Applied(())) => "applied".into(),
            Ok(Processed::Duplicate) => "duplicate".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_short_event_is_refused_and_a_later_one_that_fits_applies() {
        let items = [
            item("k1", "P1", &[("queso", 3)]),
            item("k2", "P2", &[("queso", 3), ("tomate", 1)]),
            item("k3", "P3", &[("queso", 1)]),
        ];
        let plan = plan(
            &items,
            inputs(&["k1", "k2", "k3"], &[("queso", 4), ("tomate", 9)]),
        );
        let got: Vec<String> = plan.results.iter().map(outcome).collect();
        assert_eq!(got, ["applied", "sin stock de queso", "applied"]);
        assert_eq!(plan.taken.get("queso"), Some(&4));
        assert_eq!(
            plan.taken.get("tomate"),
            None,
            "the refused order took nothing"
        );
        assert_eq!(plan.unclaim, ["k2"]);
        assert_eq!(plan.reservations.len(), 2);
        let afters: Vec<i64> = plan.events.iter().map(|e| e.after).collect();
        assert_eq!(afters, [1, 0]);
    }

    #[test]
    fn a_key_repeated_in_the_batch_applies_once() {
        let items = [
            item("k1", "P1", &[("queso", 1)]),
            item("k1", "P1", &[("queso", 1)]),
        ];
        let plan = plan(&items, inputs(&["k1"], &[("queso", 4)]));
        let got: Vec<String> = plan.results.iter().map(outcome).collect();
        assert_eq!(got, ["applied", "duplicate"]);
        assert_eq!(plan.taken.get("queso"), Some(&1));
    }

    #[test]
    fn two_events_of_one_order_reserve_once() {
        let items = [
            item("k1", "P1", &[("queso", 2)]),
            item("k2", "P1", &[("queso", 2)]),
        ];
        let plan = plan(&items, inputs(&["k1", "k2"], &[("queso", 4)]));
        let got: Vec<String> = plan.results.iter().map(outcome).collect();
        assert_eq!(got, ["applied", "applied"]);
        assert_eq!(plan.taken.get("queso"), Some(&2));
        assert_eq!(plan.reservations.len(), 1);
    }

    #[test]
    fn an_unknown_product_is_refused_whatever_the_stock() {
        let items = [item("k1", "P1", &[("queso", 1), ("trufa", 1)])];
        let plan = plan(&items, inputs(&["k1"], &[("queso", 4)]));
        assert_eq!(outcome(&plan.results[0]), "producto desconocido: trufa");
        assert!(plan.taken.is_empty());
        assert_eq!(plan.unclaim, ["k1"]);
    }

    #[test]
    fn a_key_claimed_before_is_a_duplicate() {
        let items = [item("k1", "P1", &[("queso", 1)])];
        let plan = plan(&items, inputs(&[], &[("queso", 4)]));
        assert_eq!(outcome(&plan.results[0]), "duplicate");
        assert!(plan.events.is_empty());
    }

    #[test]
    fn a_refused_key_repeated_later_is_tried_again_and_refused_again() {
        let items = [
            item("k1", "P1", &[("queso", 9)]),
            item("k1", "P1", &[("queso", 9)]),
        ];
        let plan = plan(&items, inputs(&["k1"], &[("queso", 4)]));
        let got: Vec<String> = plan.results.iter().map(outcome).collect();
        assert_eq!(got, ["sin stock de queso", "sin stock de queso"]);
        assert_eq!(plan.unclaim, ["k1"]);
    }
}
