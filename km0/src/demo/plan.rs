//! What a demo run will do: the orders it places and the stock it sets so all can succeed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use serde::Serialize;

use crate::services::inventario::INITIAL_STOCK;
use crate::services::pasarela::Faults;
use crate::services::pedidos::{Address, NewOrder, OrderLine};

/// Unit prices in cents of the seed's products.
const PRICES: &[(&str, i32)] = &[
    ("tomate-rosa", 350),
    ("calabacin", 220),
    ("queso-curado", 1450),
    ("queso-fresco", 890),
    ("vino-crianza", 1200),
];
const CUSTOMERS: &[&str] = &["ana", "marc", "laia", "jordi", "nuria", "pau"];
const MARKETS: &[&str] = &["girona", "barcelona", "tarragona", "lleida", "valencia"];
/// Cities reparto serves (the demo gives each a fleet of couriers), with a postal code and
/// a street.
pub const COVERED_CITIES: &[(&str, &str, &str)] = &[
    ("Madrid", "28012", "Calle de Atocha 12"),
    ("Barcelona", "08014", "Carrer de Sants 45"),
    ("Valencia", "46004", "Carrer de Colón 7"),
    ("Tarragona", "43003", "Rambla Nova 1"),
];
/// Cities without couriers: reparto answers `ciudad_no_cubierta`.
const UNCOVERED_CITIES: &[(&str, &str, &str)] = &[
    ("Lleida", "25007", "Carrer Major 3"),
    ("Girona", "17004", "Carrer Nou 9"),
];
/// The card the demo's gateway declines.
pub const DECLINED_CARD: &str = "tok_rechazada";
/// The card every other order pays with.
const GOOD_CARD: &str = "tok_visa";
/// Shares of the saga's orders, in percent: declined card, uncovered city, cancelled by
/// the customer right after placing it.
const DECLINED_PCT: u32 = 6;
const UNCOVERED_PCT: u32 = 6;
const CUSTOMER_CANCEL_PCT: u32 = 3;

/// What the plan expects of one order of the saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Fate {
    /// Reserved, charged, given a courier: paid (`pagado`).
    #[serde(rename = "pagado")]
    Paid,
    /// The gateway declines the card: cancelled, its stock back.
    #[serde(rename = "tarjeta_rechazada")]
    Declined,
    /// A city without couriers: refunded, its stock back, cancelled.
    #[serde(rename = "ciudad_no_cubierta")]
    Uncovered,
    /// The customer cancels right after placing it: paid or cancelled (the race decides),
    /// never both.
    #[serde(rename = "cancelado_por_cliente")]
    CustomerCancel,
}

impl Fate {
    /// Its name in the plan and the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Paid => "pagado",
            Self::Declined => "tarjeta_rechazada",
            Self::Uncovered => "ciudad_no_cubierta",
            Self::CustomerCancel => "cancelado_por_cliente",
        }
    }
}

/// Stock of one product before and after the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductPlan {
    /// Product id.
    pub product: String,
    /// Units set before the run: the seed's units plus everything ordered, so every order
    /// can be served and a correct run ends on the seed's stock.
    pub start: i64,
    /// Units ordered by all the run's orders.
    pub ordered: i64,
}

impl ProductPlan {
    /// Units expected after every order is applied exactly once.
    pub fn expected(&self) -> i64 {
        self.start - self.ordered
    }
}

/// The orders of a run and the stock they need.
#[derive(Debug, Clone)]
pub struct DemoPlan {
    /// Orders to place, in order.
    pub orders: Vec<NewOrder>,
    /// Per product, sorted by product.
    pub stock: Vec<ProductPlan>,
    /// The order saga's part, when the run goes through it.
    pub saga: Option<SagaPlan>,
}

/// What a run through the order saga adds: each order's fate and the gateway's faults.
#[derive(Debug, Clone)]
pub struct SagaPlan {
    /// One per order, in order.
    pub fates: Vec<Fate>,
    /// The gateway's faults: the declined card, some 503s, some charges whose answer is
    /// lost after charging.
    pub faults: Faults,
}

impl SagaPlan {
    /// How many orders have `fate`.
    pub fn count(&self, fate: Fate) -> usize {
        self.fates.iter().filter(|f| **f == fate).count()
    }
}

impl DemoPlan {
    /// `count` orders of one to three lines of the seed's products, reproducible from `seed`;
    /// ids carry `run` so runs against the same database never collide.
    pub fn generate(count: usize, run: &str, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ordered: BTreeMap<&str, i64> = PRICES.iter().map(|(p, _)| (*p, 0)).collect();
        let orders = (1..=count)
            .map(|n| {
                let lines_wanted = rng.gen_range(1..=3);
                let lines: Vec<OrderLine> = PRICES
                    .choose_multiple(&mut rng, lines_wanted)
                    .map(|(product, price)| {
                        let quantity = rng.gen_range(1..=3);
                        *ordered.entry(product).or_insert(0) += i64::from(quantity);
                        OrderLine {
                            product: (*product).to_owned(),
                            quantity,
                            price_cents: *price,
                        }
                    })
                    .collect();
                NewOrder {
                    id: format!("P-{run}-{n:06}"),
                    customer: CUSTOMERS[rng.gen_range(0..CUSTOMERS.len())].to_owned(),
                    market: MARKETS[rng.gen_range(0..MARKETS.len())].to_owned(),
                    lines,
                    card: None,
                    address: None,
                }
            })
            .collect();
        let stock = ordered
            .into_iter()
            .map(|(product, ordered)| {
                let seed_units = INITIAL_STOCK
                    .iter()
                    .find(|(p, _)| *p == product)
                    .map_or(0, |(_, u)| *u);
                ProductPlan {
                    product: product.to_owned(),
                    start: seed_units + ordered,
                    ordered,
                }
            })
            .collect();
        Self {
            orders,
            stock,
            saga: None,
        }
    }

    /// Like [`DemoPlan::generate`], through the order saga: every order gets a card and a
    /// delivery address, and a fate drawn from `seed` (declined cards, uncovered cities,
    /// customers who cancel at once), with gateway faults sized to the run.
    pub fn generate_saga(count: usize, run: &str, seed: u64) -> Self {
        let mut plan = Self::generate(count, run, seed);
        // A stream of its own, so the orders themselves are those of the seed flow.
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5a6a);
        let mut fates = Vec::with_capacity(count);
        for order in &mut plan.orders {
            let roll = rng.gen_range(0..100);
            let fate = if roll < DECLINED_PCT {
                Fate::Declined
            } else if roll < DECLINED_PCT + UNCOVERED_PCT {
                Fate::Uncovered
            } else if roll < DECLINED_PCT + UNCOVERED_PCT + CUSTOMER_CANCEL_PCT {
                Fate::CustomerCancel
            } else {
                Fate::Paid
            };
            let cities = match fate {
                Fate::Uncovered => UNCOVERED_CITIES,
                _ => COVERED_CITIES,
            };
            let (city, postal_code, street) = cities[rng.gen_range(0..cities.len())];
            order.address = Some(Address {
                city: city.to_owned(),
                postal_code: postal_code.to_owned(),
                street: street.to_owned(),
            });
            order.card = Some(
                match fate {
                    Fate::Declined => DECLINED_CARD,
                    _ => GOOD_CARD,
                }
                .to_owned(),
            );
            fates.push(fate);
        }
        let faults = Faults {
            // A run of 503s pagos outlasts even if they all fall on one charge: its own quick
            // tries times the consumer's default attempts.
            fail_503: u32::try_from(count / 50).unwrap_or(u32::MAX).min(8),
            hang_after_charge: u32::from(count >= 100) * 2,
            // Longer than pagos' gateway timeout: pagos gives up and asks again.
            hang_ms: 6_000,
            declined_cards: vec![DECLINED_CARD.to_owned()],
            ..Faults::default()
        };
        plan.saga = Some(SagaPlan { fates, faults });
        plan
    }

    /// Total units over all orders.
    pub fn units(&self) -> i64 {
        self.stock.iter().map(|p| p.ordered).sum()
    }

    /// The plan as a short table for the terminal.
    pub fn render(&self) -> String {
        let mut out = format!(
            "plan: {} orders, {} units; stock set to the seed's plus what is ordered\n",
            self.orders.len(),
            self.units()
        );
        let _ = writeln!(
            out,
            "  {:<14} {:>8} {:>8} {:>9}",
            "product", "start", "ordered", "expected"
        );
        for p in &self.stock {
            let _ = writeln!(
                out,
                "  {:<14} {:>8} {:>8} {:>9}",
                p.product,
                p.start,
                p.ordered,
                p.expected()
            );
        }
        if let Some(saga) = &self.saga {
            let _ = writeln!(
                out,
                "through the order saga (reserve, charge, courier); expected final states:"
            );
            for fate in [
                Fate::Paid,
                Fate::Declined,
                Fate::Uncovered,
                Fate::CustomerCancel,
            ] {
                let _ = writeln!(out, "  {:<22} {:>6}", fate.name(), saga.count(fate));
            }
            let f = &saga.faults;
            let _ = writeln!(
                out,
                "gateway faults: {} answers 503, {} charges whose answer is lost after \
                 charging, card {} declined",
                f.fail_503, f.hang_after_charge, DECLINED_CARD
            );
            out.push_str("expected stock: start minus the units of the orders that end paid\n");
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_saga_plan_mixes_every_fate_reproducibly() {
        let a = DemoPlan::generate_saga(1000, "r", 7);
        let b = DemoPlan::generate_saga(1000, "r", 7);
        assert_eq!(a.orders, b.orders);
        let saga = a.saga.as_ref().unwrap();
        assert_eq!(saga.fates, b.saga.as_ref().unwrap().fates);
        assert_eq!(saga.fates.len(), 1000);
        for fate in [
            Fate::Paid,
            Fate::Declined,
            Fate::Uncovered,
            Fate::CustomerCancel,
        ] {
            assert!(saga.count(fate) > 0, "{fate:?}");
        }
        for (order, fate) in a.orders.iter().zip(&saga.fates) {
            let city = &order.address.as_ref().unwrap().city;
            let covered = COVERED_CITIES.iter().any(|(c, _, _)| c == city);
            assert_eq!(covered, *fate != Fate::Uncovered, "{order:?}");
            let declined = order.card.as_deref() == Some(DECLINED_CARD);
            assert_eq!(declined, *fate == Fate::Declined, "{order:?}");
        }
        assert!(saga.faults.fail_503 > 0 && saga.faults.hang_after_charge > 0);
        // The same orders as the seed flow's plan, with the saga's fields added.
        let plain = DemoPlan::generate(1000, "r", 7);
        assert_eq!(plain.orders[0].lines, a.orders[0].lines);
    }

    #[test]
    fn the_plan_is_reproducible_and_always_servable() {
        let a = DemoPlan::generate(300, "r", 7);
        let b = DemoPlan::generate(300, "r", 7);
        assert_eq!(a.orders, b.orders);
        assert_eq!(a.orders.len(), 300);
        let sum: i64 = a.orders.iter().map(NewOrder::units).sum();
        assert_eq!(sum, a.units());
        for p in &a.stock {
            let seed = INITIAL_STOCK
                .iter()
                .find(|(s, _)| *s == p.product)
                .unwrap()
                .1;
            assert_eq!(p.expected(), seed, "a correct run ends on the seed's stock");
        }
        for order in &a.orders {
            let mut products: Vec<_> = order.lines.iter().map(|l| &l.product).collect();
            products.sort();
            products.dedup();
            assert_eq!(
                products.len(),
                order.lines.len(),
                "distinct products per order"
            );
        }
    }
}
