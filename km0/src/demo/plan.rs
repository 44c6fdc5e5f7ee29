//! What a demo run will do: the orders it places and the stock it sets so all can succeed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::services::inventario::INITIAL_STOCK;
use crate::services::pedidos::{NewOrder, OrderLine};

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
        Self { orders, stock }
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
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

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
