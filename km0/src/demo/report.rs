//! The demo's closing report: what happened, and the invariants that must hold after it.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::facts::SagaSummary;
use super::plan::ProductPlan;

/// Final units of one product against the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StockCheck {
    /// Product id.
    pub product: String,
    /// Units before the run.
    pub start: i64,
    /// Units ordered.
    pub ordered: i64,
    /// `start - ordered`.
    pub expected: i64,
    /// Units found after the run (`None`: the product is gone).
    pub actual: Option<i64>,
}

impl StockCheck {
    /// Pairs a planned product with the units found.
    pub fn new(plan: &ProductPlan, actual: Option<i64>) -> Self {
        Self {
            product: plan.product.clone(),
            start: plan.start,
            ordered: plan.ordered,
            expected: plan.expected(),
            actual,
        }
    }

    /// Whether the units found are the units expected.
    pub fn holds(&self) -> bool {
        self.actual == Some(self.expected)
    }
}

/// One invariant and whether it held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Invariant {
    /// What must hold.
    pub name: &'static str,
    /// Whether it did.
    pub holds: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

/// Figures of a finished run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DemoReport {
    /// Orders the plan placed.
    pub orders_planned: u64,
    /// Orders the API accepted (201, or 409 for a retried request that had been stored).
    pub orders_accepted: u64,
    /// Orders the API refused for good.
    pub orders_failed: u64,
    /// Rows of the outbox marked published.
    pub events_published: u64,
    /// Messages appended to the topic (a relay that republishes adds duplicates here);
    /// `None` on RabbitMQ, whose queues keep no log to count.
    pub messages_on_topic: Option<u64>,
    /// Keys recorded by the stock consumer: orders applied.
    pub consumed: u64,
    /// Deliveries the consumer recognised as already applied.
    pub duplicates: u64,
    /// Events the demo published a second time on purpose.
    pub redelivered: u64,
    /// Messages set aside on the dead-letter topic.
    pub dead_letters: u64,
    /// Outbox rows still unpublished at the end.
    pub outbox_pending: u64,
    /// Whether everything was consumed before the deadline.
    pub drained: bool,
    /// Per product, final against expected units.
    pub stock: Vec<StockCheck>,
    /// Time to place the orders, in ms.
    pub placing_ms: u64,
    /// Time from start until the last order was consumed, in ms.
    pub total_ms: u64,
    /// A run through the order saga: how its orders ended and the saga's invariants.
    pub saga: Option<SagaSummary>,
}

impl DemoReport {
    /// Every invariant of the run, in report order.
    pub fn invariants(&self) -> Vec<Invariant> {
        if let Some(saga) = &self.saga {
            return self.saga_invariants(saga);
        }
        let stock_ok = !self.stock.is_empty() && self.stock.iter().all(StockCheck::holds);
        let wrong: Vec<String> = self
            .stock
            .iter()
            .filter(|c| !c.holds())
            .map(|c| format!("{}: {:?} != {}", c.product, c.actual, c.expected))
            .collect();
        vec![
            self.accepted(),
            Invariant {
                name: "every order applied exactly once",
                holds: self.consumed == self.orders_accepted,
                detail: format!(
                    "mensajes_procesados {} == orders {}",
                    self.consumed, self.orders_accepted
                ),
            },
            Invariant {
                name: "stock == start - ordered",
                holds: stock_ok,
                detail: if wrong.is_empty() {
                    format!("{} products", self.stock.len())
                } else {
                    wrong.join(", ")
                },
            },
            Invariant {
                name: "every redelivery absorbed",
                holds: self.duplicates >= self.redelivered,
                detail: format!(
                    "{} duplicates absorbed of {} redelivered",
                    self.duplicates, self.redelivered
                ),
            },
            self.drained_outbox("outbox drained"),
            Invariant {
                name: "no dead letters",
                holds: self.dead_letters == 0,
                detail: format!("{} dead letters", self.dead_letters),
            },
        ]
    }

    fn drained_outbox(&self, name: &'static str) -> Invariant {
        let services: Vec<String> = self
            .saga
            .iter()
            .flat_map(|s| &s.outbox_pending_in)
            .map(|(service, n)| format!("{n} in {service}"))
            .collect();
        Invariant {
            name,
            holds: self.outbox_pending == 0,
            detail: match services.is_empty() {
                true => format!("{} pending", self.outbox_pending),
                false => format!("{} pending: {}", self.outbox_pending, services.join(", ")),
            },
        }
    }

    fn accepted(&self) -> Invariant {
        Invariant {
            name: "every order accepted",
            holds: self.orders_accepted == self.orders_planned,
            detail: format!("{} of {}", self.orders_accepted, self.orders_planned),
        }
    }

    fn saga_invariants(&self, saga: &SagaSummary) -> Vec<Invariant> {
        let mut all = vec![self.accepted()];
        all.extend(saga.invariants.iter().cloned());
        all.extend([
            Invariant {
                name: "redelivered commands and replies changed nothing",
                holds: saga.unchanged_by_redelivery && self.drained,
                detail: format!(
                    "{} published again, every row the same: {}",
                    saga.redelivered, saga.unchanged_by_redelivery
                ),
            },
            self.drained_outbox("every outbox drained"),
            Invariant {
                name: "no dead letters",
                holds: self.dead_letters == 0,
                detail: match saga.dead_letters_in.is_empty() {
                    true => format!("{} dead letters over every group", self.dead_letters),
                    false => {
                        let places: Vec<String> = saga
                            .dead_letters_in
                            .iter()
                            .map(|(place, n)| format!("{n} in {place}"))
                            .collect();
                        places.join(", ")
                    }
                },
            },
        ]);
        all
    }

    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.invariants().iter().all(|i| i.holds)
    }

    /// The report as JSON: its figures, every invariant with its verdict, and `passed`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert(
                "invariants".to_owned(),
                serde_json::to_value(self.invariants()).unwrap_or_default(),
            );
            map.insert("passed".to_owned(), self.passed().into());
        }
        value
    }

    /// The report for the terminal.
    pub fn render(&self) -> String {
        let mut out = String::from("\nkm0 demo report\n");
        let secs = |ms: u64| Duration::from_millis(ms).as_secs_f64();
        let done = match self.saga {
            Some(_) => self.orders_accepted,
            None => self.consumed,
        };
        let rate = if self.total_ms > 0 {
            done as f64 / secs(self.total_ms)
        } else {
            0.0
        };
        let mut rows: Vec<(&str, String)> = vec![
            (
                "orders accepted",
                format!("{} of {}", self.orders_accepted, self.orders_planned),
            ),
            ("orders failed", self.orders_failed.to_string()),
            ("events published", self.events_published.to_string()),
            (
                "messages on topic",
                self.messages_on_topic.map_or_else(
                    || "n/a (RabbitMQ keeps no log)".to_owned(),
                    |n| n.to_string(),
                ),
            ),
            ("consumed", self.consumed.to_string()),
            ("redelivered (test)", self.redelivered.to_string()),
            ("duplicates absorbed", self.duplicates.to_string()),
            ("dead letters", self.dead_letters.to_string()),
            ("placing time", format!("{:.2}s", secs(self.placing_ms))),
            (
                "end to end",
                format!("{:.2}s ({rate:.0} orders/s)", secs(self.total_ms)),
            ),
        ];
        if let Some(saga) = &self.saga {
            rows = saga_rows(self, saga, rate);
        }
        for (name, value) in rows {
            let _ = writeln!(out, "  {name:<22} {value}");
        }
        if let Some(saga) = &self.saga {
            let _ = writeln!(
                out,
                "\n  {:<22} {:>8} {:>8} {:>9}",
                "planned fate", "orders", "paid", "cancelled"
            );
            for (fate, n) in &saga.by_fate {
                let _ = writeln!(
                    out,
                    "  {fate:<22} {:>8} {:>8} {:>9}",
                    n.planned, n.paid, n.cancelled
                );
            }
        }
        // Through the saga only the orders that end paid keep their units.
        let taken = match self.saga {
            Some(_) => "paid",
            None => "ordered",
        };
        let _ = writeln!(
            out,
            "\n  {:<14} {:>8} {:>8} {:>9} {:>8}",
            "product", "start", taken, "expected", "final"
        );
        for c in &self.stock {
            let actual = c.actual.map_or_else(|| "-".to_owned(), |a| a.to_string());
            let mark = if c.holds() { "" } else { "  <- wrong" };
            let _ = writeln!(
                out,
                "  {:<14} {:>8} {:>8} {:>9} {:>8}{mark}",
                c.product, c.start, c.ordered, c.expected, actual
            );
        }
        out.push_str("\ninvariants\n");
        for i in self.invariants() {
            let verdict = if i.holds { "ok  " } else { "FAIL" };
            let _ = writeln!(out, "  [{verdict}] {:<48} {}", i.name, i.detail);
        }
        let _ = writeln!(
            out,
            "\n{}",
            if self.passed() {
                "all invariants hold"
            } else {
                "SOME INVARIANTS FAILED"
            }
        );
        out
    }
}

/// The figures of a run through the saga (the stock consumer's own counts mean little
/// there: its orders come as commands).
fn saga_rows(report: &DemoReport, saga: &SagaSummary, rate: f64) -> Vec<(&'static str, String)> {
    let secs = |ms: u64| Duration::from_millis(ms).as_secs_f64();
    let paid: u64 = saga.by_fate.values().map(|n| n.paid).sum();
    let cancelled: u64 = saga.by_fate.values().map(|n| n.cancelled).sum();
    vec![
        (
            "orders accepted",
            format!("{} of {}", report.orders_accepted, report.orders_planned),
        ),
        ("orders failed", report.orders_failed.to_string()),
        ("paid", paid.to_string()),
        ("cancelled", cancelled.to_string()),
        (
            "customer cancels",
            format!(
                "{} taken, {} too late (charged, courier asked for)",
                saga.cancels_taken, saga.cancels_too_late
            ),
        ),
        (
            "gateway ledger",
            format!(
                "{} charges, {} refunds, net {:.2} EUR",
                saga.charges,
                saga.refunds,
                saga.net_cents as f64 / 100.0
            ),
        ),
        (
            "sagas for an operator",
            saga.waiting_for_operator.to_string(),
        ),
        ("redelivered (test)", saga.redelivered.to_string()),
        ("dead letters", report.dead_letters.to_string()),
        ("placing time", format!("{:.2}s", secs(report.placing_ms))),
        (
            "end to end",
            format!("{:.2}s ({rate:.0} orders/s)", secs(report.total_ms)),
        ),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn good() -> DemoReport {
        DemoReport {
            orders_planned: 2,
            orders_accepted: 2,
            consumed: 2,
            drained: true,
            stock: vec![StockCheck {
                product: "calabacin".into(),
                start: 80,
                ordered: 3,
                expected: 77,
                actual: Some(77),
            }],
            ..DemoReport::default()
        }
    }

    #[test]
    fn a_clean_run_passes() {
        assert!(good().passed());
        assert!(good().render().contains("all invariants hold"));
    }

    #[test]
    fn each_broken_invariant_fails_the_run() {
        let mut twice = good();
        twice.consumed = 3;
        let mut stock = good();
        stock.stock[0].actual = Some(74);
        let mut pending = good();
        pending.outbox_pending = 1;
        let mut dead = good();
        dead.dead_letters = 1;
        for report in [twice, stock, pending, dead] {
            assert!(!report.passed(), "{report:?}");
        }
    }

    fn saga_run() -> DemoReport {
        DemoReport {
            saga: Some(SagaSummary {
                unchanged_by_redelivery: true,
                redelivered: 4,
                invariants: vec![Invariant {
                    name: "a paid order was charged once",
                    holds: true,
                    detail: "2 orders".into(),
                }],
                ..SagaSummary::default()
            }),
            ..good()
        }
    }

    #[test]
    fn a_saga_run_is_judged_by_the_saga_invariants_and_says_so_in_json() {
        let report = saga_run();
        assert!(report.passed(), "{}", report.render());
        let json = report.to_json();
        assert_eq!(json["passed"], true);
        let names: Vec<&str> = json["invariants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"a paid order was charged once"),
            "{names:?}"
        );
        assert!(names.contains(&"no dead letters"), "{names:?}");
        // The stock consumer's own count does not judge a saga run.
        assert!(!names.contains(&"every order applied exactly once"));

        let mut charged_twice = saga_run();
        if let Some(saga) = charged_twice.saga.as_mut() {
            saga.invariants[0].holds = false;
        }
        let mut changed = saga_run();
        if let Some(saga) = changed.saga.as_mut() {
            saga.unchanged_by_redelivery = false;
        }
        let mut dead = saga_run();
        dead.dead_letters = 1;
        if let Some(saga) = dead.saga.as_mut() {
            saga.dead_letters_in = vec![("pagos.cobros.dlq".into(), 1)];
        }
        assert!(dead.render().contains("1 in pagos.cobros.dlq"));
        let mut stuck = saga_run();
        stuck.outbox_pending = 91;
        if let Some(saga) = stuck.saga.as_mut() {
            saga.outbox_pending_in = vec![("pagos".into(), 91)];
        }
        assert!(
            stuck.render().contains("91 pending: 91 in pagos"),
            "{}",
            stuck.render()
        );
        for report in [charged_twice, changed, dead, stuck] {
            assert!(!report.passed(), "{}", report.render());
            assert_eq!(report.to_json()["passed"], false);
        }
    }
}
