//! What a run through the order saga left behind, read from every service's own rows (the
//! orders, the sagas, the gateway's ledger, the deliveries, the stock), and the invariants
//! those rows must satisfy.

use std::collections::BTreeMap;

use entrega::saga::{SagaStatus, Sagas};
use serde::Serialize;

use super::plan::{DemoPlan, Fate, ProductPlan};
use super::report::{Invariant, StockCheck};
use crate::services::inventario::StockStore;
use crate::services::pasarela::{Ledger, ReferenceTotals};
use crate::services::pedidos::{OrderState, OrderStore};
use crate::services::reparto::{DeliveryState, DeliveryStore};

/// Offenders listed in an invariant's detail, at most.
const SHOWN: usize = 5;

/// One order as every service sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrderFacts {
    /// pedidos' state; `None`: the order is not there.
    pub state: Option<OrderState>,
    /// Its saga's status; `None`: no saga.
    pub saga: Option<SagaStatus>,
    /// What the gateway charged and refunded for it.
    pub ledger: ReferenceTotals,
    /// reparto's delivery and its courier, if any.
    pub delivery: Option<(DeliveryState, Option<String>)>,
}

/// Every planned order's facts and every planned product's units, in plan order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// One per planned order.
    pub orders: Vec<OrderFacts>,
    /// One per planned product.
    pub stock: Vec<Option<i64>>,
}

/// The stores a snapshot reads.
pub struct Sources<'a> {
    /// pedidos.
    pub orders: &'a OrderStore,
    /// The order sagas (in pedidos' database).
    pub sagas: &'a Sagas,
    /// The gateway's ledger.
    pub ledger: &'a Ledger,
    /// reparto.
    pub deliveries: &'a DeliveryStore,
    /// inventario.
    pub stock: &'a StockStore,
}

impl Snapshot {
    /// Reads the facts of every order and product of `plan`, whose order ids start with
    /// `prefix`.
    pub async fn read(from: &Sources<'_>, plan: &DemoPlan, prefix: &str) -> anyhow::Result<Self> {
        let states = from.orders.states(prefix).await?;
        let sagas: BTreeMap<String, SagaStatus> = from
            .sagas
            .list(None, usize::MAX)
            .await?
            .into_iter()
            .filter(|s| s.id.starts_with(prefix))
            .map(|s| (s.id, s.status))
            .collect();
        let mut ledger = from.ledger.totals().await?;
        let deliveries: BTreeMap<String, (DeliveryState, Option<String>)> = from
            .deliveries
            .deliveries()
            .await?
            .into_iter()
            .filter(|d| d.order_id.starts_with(prefix))
            .map(|d| (d.order_id, (d.state, d.courier)))
            .collect();
        let orders = plan
            .orders
            .iter()
            .map(|o| OrderFacts {
                state: states.get(&o.id).copied(),
                saga: sagas.get(&o.id).copied(),
                ledger: ledger.remove(&o.id).unwrap_or_default(),
                delivery: deliveries.get(&o.id).cloned(),
            })
            .collect();
        let mut stock = Vec::with_capacity(plan.stock.len());
        for product in &plan.stock {
            stock.push(from.stock.units(&product.product).await?);
        }
        Ok(Self { orders, stock })
    }

    /// How many planned orders' sagas are over.
    pub fn finished(&self) -> usize {
        self.orders
            .iter()
            .filter(|o| o.saga.is_some_and(SagaStatus::is_final))
            .count()
    }

    /// Whether every planned order's saga is over.
    pub fn all_final(&self) -> bool {
        self.orders
            .iter()
            .all(|o| o.saga.is_some_and(SagaStatus::is_final))
    }
}

/// How the run's orders ended, by planned fate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SagaSummary {
    /// Per planned fate: orders planned, ended paid, ended cancelled.
    pub by_fate: BTreeMap<&'static str, FateCount>,
    /// Sagas waiting for an operator.
    pub waiting_for_operator: u64,
    /// Sagas not over when the run ended.
    pub unfinished: u64,
    /// Customer cancels the API took (202).
    pub cancels_taken: u64,
    /// Customer cancels refused because the order was past its point of no return: charged
    /// with its courier asked for, or paid (409).
    pub cancels_too_late: u64,
    /// Approved charges in the ledger for the run's orders.
    pub charges: u64,
    /// Refunds in the ledger for the run's orders.
    pub refunds: u64,
    /// Charged net of refunds, in cents.
    pub net_cents: i64,
    /// Commands and replies the demo published a second time once all sagas were over.
    pub redelivered: u64,
    /// Whether every row read the same after those were consumed.
    pub unchanged_by_redelivery: bool,
    /// The dead-letter topics (or queues) this run added to, with how many each.
    pub dead_letters_in: Vec<(String, u64)>,
    /// The services whose outbox still held unpublished rows at the end, with how many.
    pub outbox_pending_in: Vec<(String, u64)>,
    /// The saga's own invariants, with their verdicts.
    pub invariants: Vec<Invariant>,
}

/// Orders of one planned fate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FateCount {
    /// Planned.
    pub planned: u64,
    /// Ended paid.
    pub paid: u64,
    /// Ended cancelled.
    pub cancelled: u64,
}

/// Collects offenders and renders them into an invariant.
struct Offenders {
    ids: Vec<String>,
}

impl Offenders {
    fn new() -> Self {
        Self { ids: Vec::new() }
    }

    fn add(&mut self, id: &str, why: impl std::fmt::Display) {
        self.ids.push(format!("{id} ({why})"));
    }

    fn into_invariant(self, name: &'static str, checked: usize) -> Invariant {
        let detail = if self.ids.is_empty() {
            format!("{checked} orders")
        } else {
            let shown: Vec<&str> = self.ids.iter().take(SHOWN).map(String::as_str).collect();
            format!("{} of {checked}: {}", self.ids.len(), shown.join(", "))
        };
        Invariant {
            name,
            holds: self.ids.is_empty(),
            detail,
        }
    }
}

/// The summary and the saga invariants of `after` against `plan`, and each product's units
/// against the units of the orders that ended paid; `before` is the snapshot taken before
/// the redelivery (the same rows must be read after it).
pub fn summarise(
    plan: &DemoPlan,
    before: &Snapshot,
    after: &Snapshot,
) -> (SagaSummary, Vec<StockCheck>) {
    let fates: Vec<Fate> = plan
        .saga
        .as_ref()
        .map(|s| s.fates.clone())
        .unwrap_or_default();
    let mut summary = SagaSummary::default();
    let (mut final_state, mut as_planned, mut paid_once) =
        (Offenders::new(), Offenders::new(), Offenders::new());
    let (mut courier, mut cancelled_clean) = (Offenders::new(), Offenders::new());
    let mut taken: BTreeMap<&str, i64> = BTreeMap::new();
    for ((order, facts), fate) in plan.orders.iter().zip(&after.orders).zip(&fates) {
        let id = order.id.as_str();
        let count = summary.by_fate.entry(fate.name()).or_default();
        count.planned += 1;
        summary.charges += facts.ledger.charges;
        summary.refunds += facts.ledger.refunds;
        summary.net_cents += facts.ledger.net_cents();
        match facts.saga {
            Some(SagaStatus::NeedsOperator) => summary.waiting_for_operator += 1,
            Some(s) if s.is_final() => {}
            _ => summary.unfinished += 1,
        }
        let ended = match (facts.state, facts.saga) {
            (Some(OrderState::Paid), Some(SagaStatus::Completed)) => OrderState::Paid,
            (Some(OrderState::Cancelled), Some(SagaStatus::Compensated)) => OrderState::Cancelled,
            (state, saga) => {
                final_state.add(id, format!("order {state:?}, saga {saga:?}"));
                continue;
            }
        };
        let expected = match fate {
            Fate::Paid => Some(OrderState::Paid),
            Fate::Declined | Fate::Uncovered => Some(OrderState::Cancelled),
            Fate::CustomerCancel => None,
        };
        if expected.is_some_and(|e| e != ended) {
            as_planned.add(id, format!("{} but {}", fate.name(), ended.as_str()));
        }
        let held = facts.delivery.as_ref().map(|(state, _)| *state);
        if ended == OrderState::Paid {
            count.paid += 1;
            for line in &order.lines {
                *taken.entry(line.product.as_str()).or_insert(0) += i64::from(line.quantity);
            }
            let l = &facts.ledger;
            if l.charges != 1 || l.refunds != 0 || l.charged_cents != order.amount_cents() {
                paid_once.add(id, format!("{l:?}, amount {}", order.amount_cents()));
            }
            let has_courier = matches!(
                &facts.delivery,
                Some((DeliveryState::Assigned | DeliveryState::Delivered, Some(_)))
            );
            if !has_courier {
                courier.add(id, format!("{:?}", facts.delivery));
            }
        } else {
            count.cancelled += 1;
            let l = &facts.ledger;
            let holds_courier = matches!(
                held,
                Some(DeliveryState::Assigned | DeliveryState::Delivered | DeliveryState::Pending)
            );
            if l.net_cents() != 0 || l.refunds != l.charges || holds_courier {
                cancelled_clean.add(id, format!("{l:?}, delivery {:?}", facts.delivery));
            }
        }
    }
    let stock_checks: Vec<StockCheck> = plan
        .stock
        .iter()
        .zip(&after.stock)
        .map(|(p, actual)| {
            let paid = ProductPlan {
                product: p.product.clone(),
                start: p.start,
                ordered: taken.get(p.product.as_str()).copied().unwrap_or(0),
            };
            StockCheck::new(&paid, *actual)
        })
        .collect();
    let wrong: Vec<String> = stock_checks
        .iter()
        .filter(|c| !c.holds())
        .map(|c| format!("{}: {:?} != {}", c.product, c.actual, c.expected))
        .collect();
    summary.unchanged_by_redelivery = before == after;
    let n = plan.orders.len();
    summary.invariants = vec![
        final_state.into_invariant("every order reached a final state", n),
        as_planned.into_invariant("every order ended as planned", n),
        paid_once.into_invariant("a paid order was charged once", n),
        courier.into_invariant("a paid order has one courier", n),
        cancelled_clean.into_invariant("a cancelled order: net 0, no courier", n),
        Invariant {
            name: "stock == start - paid orders' units",
            holds: wrong.is_empty() && !stock_checks.is_empty(),
            detail: if wrong.is_empty() {
                format!("{} products", stock_checks.len())
            } else {
                wrong.join(", ")
            },
        },
        Invariant {
            name: "no saga waiting for an operator",
            holds: summary.waiting_for_operator == 0 && summary.unfinished == 0,
            detail: format!(
                "{} waiting, {} unfinished",
                summary.waiting_for_operator, summary.unfinished
            ),
        },
    ];
    (summary, stock_checks)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The facts of a run in which every order ended as planned (customer cancels paid).
    fn clean(plan: &DemoPlan) -> Snapshot {
        let fates = &plan.saga.as_ref().unwrap().fates;
        let mut taken: BTreeMap<&str, i64> = BTreeMap::new();
        let orders = plan
            .orders
            .iter()
            .zip(fates)
            .map(|(order, fate)| {
                let paid = matches!(fate, Fate::Paid | Fate::CustomerCancel);
                let amount = order.amount_cents();
                if paid {
                    for l in &order.lines {
                        *taken.entry(l.product.as_str()).or_insert(0) += i64::from(l.quantity);
                    }
                }
                OrderFacts {
                    state: Some(if paid {
                        OrderState::Paid
                    } else {
                        OrderState::Cancelled
                    }),
                    saga: Some(if paid {
                        SagaStatus::Completed
                    } else {
                        SagaStatus::Compensated
                    }),
                    ledger: match fate {
                        Fate::Declined => ReferenceTotals::default(),
                        Fate::Uncovered => ReferenceTotals {
                            charges: 1,
                            charged_cents: amount,
                            refunds: 1,
                            refunded_cents: amount,
                        },
                        _ => ReferenceTotals {
                            charges: 1,
                            charged_cents: amount,
                            ..ReferenceTotals::default()
                        },
                    },
                    delivery: match fate {
                        Fate::Uncovered => Some((DeliveryState::Refused, None)),
                        Fate::Declined => None,
                        _ => Some((DeliveryState::Delivered, Some("R-1".into()))),
                    },
                }
            })
            .collect();
        let stock = plan
            .stock
            .iter()
            .map(|p| Some(p.start - taken.get(p.product.as_str()).copied().unwrap_or(0)))
            .collect();
        Snapshot { orders, stock }
    }

    fn failing(summary: &SagaSummary) -> Vec<&'static str> {
        summary
            .invariants
            .iter()
            .filter(|i| !i.holds)
            .map(|i| i.name)
            .collect()
    }

    #[test]
    fn a_run_that_ended_as_planned_holds_every_invariant() {
        let plan = DemoPlan::generate_saga(300, "r", 3);
        let facts = clean(&plan);
        let (summary, _) = summarise(&plan, &facts, &facts);
        assert!(failing(&summary).is_empty(), "{summary:?}");
        assert!(summary.unchanged_by_redelivery);
        let paid = &summary.by_fate["pagado"];
        assert_eq!(paid.paid, paid.planned);
    }

    #[test]
    fn each_broken_fact_fails_its_invariant() {
        let plan = DemoPlan::generate_saga(300, "r", 3);
        let fates = plan.saga.as_ref().unwrap().fates.clone();
        let paid = fates.iter().position(|f| *f == Fate::Paid).unwrap();
        let uncovered = fates.iter().position(|f| *f == Fate::Uncovered).unwrap();
        type Breaks = Box<dyn Fn(&mut Snapshot)>;
        let cases: Vec<(&str, Breaks)> = vec![
            (
                "every order reached a final state",
                Box::new(move |s| s.orders[paid].saga = Some(SagaStatus::Running)),
            ),
            (
                "a paid order was charged once",
                Box::new(move |s| s.orders[paid].ledger.charges = 2),
            ),
            (
                "a paid order has one courier",
                Box::new(move |s| s.orders[paid].delivery = None),
            ),
            (
                "a cancelled order: net 0, no courier",
                Box::new(move |s| s.orders[uncovered].ledger.refunds = 0),
            ),
            (
                "stock == start - paid orders' units",
                Box::new(|s| s.stock[0] = s.stock[0].map(|u| u - 1)),
            ),
            (
                "every order ended as planned",
                Box::new(move |s| {
                    s.orders[uncovered].state = Some(OrderState::Paid);
                    s.orders[uncovered].saga = Some(SagaStatus::Completed);
                }),
            ),
        ];
        for (name, breaks) in cases {
            let mut facts = clean(&plan);
            breaks(&mut facts);
            let (summary, _) = summarise(&plan, &clean(&plan), &facts);
            assert!(failing(&summary).contains(&name), "{name}: {summary:?}");
            assert!(!summary.unchanged_by_redelivery);
        }
    }
}
