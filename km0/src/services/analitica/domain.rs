//! Sales per market, from the orders' `pedido.creado` events: what each order is worth
//! (`cantidad × precio_centimos` over its lines) and the totals of a batch per market.
//! No I/O.

use std::collections::BTreeMap;

use entrega::{ContractError, View};
use entrega_core::Envelope;
use serde::Deserialize;

use crate::contracts;

/// One order's contribution to its market's sales.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sale {
    /// The order (`id`).
    pub order_id: String,
    /// Its market (`mercado`).
    pub market: String,
    /// Units over every line.
    pub units: i64,
    /// Value in cents over every line.
    pub cents: i64,
}

/// Why a `pedido.creado` payload cannot be counted; permanent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SaleError {
    /// The event does not meet its contract (a field missing or of the wrong type, a
    /// version with no path to one analitica reads).
    #[error("esquema: {0}")]
    Contract(ContractError),
    /// A line with negative units or price, or totals past what 64 bits hold.
    #[error("line {line}: {reason}")]
    BadLine {
        /// The line's index.
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
}

/// What analitica reads of a `pedido.creado`: versions 1 and 2 carry it alike. An order
/// without a market cannot be counted per market.
#[derive(Debug, Deserialize)]
pub struct OrderView {
    id: String,
    mercado: String,
    lineas: Vec<LineView>,
}

impl View for OrderView {
    const TIPO: &'static str = crate::services::pedidos::ORDER_CREATED;
    const VERSIONS: &'static [u32] = &[1, 2];
}

#[derive(Debug, Deserialize)]
struct LineView {
    cantidad: i64,
    precio_centimos: i64,
}

impl Sale {
    /// Reads the order in a `pedido.creado` (an older version through km0's upcasters);
    /// members analitica does not read are ignored.
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, SaleError> {
        let order: OrderView = contracts::upcasters()
            .decode(envelope)
            .map_err(SaleError::Contract)?;
        Self::from_order(order)
    }

    fn from_order(order: OrderView) -> Result<Self, SaleError> {
        let (mut units, mut cents) = (0i64, 0i64);
        for (line, l) in order.lineas.iter().enumerate() {
            if l.cantidad < 0 || l.precio_centimos < 0 {
                return Err(SaleError::BadLine {
                    line,
                    reason: "negative units or price",
                });
            }
            let overflow = SaleError::BadLine {
                line,
                reason: "total out of range",
            };
            let value = l
                .cantidad
                .checked_mul(l.precio_centimos)
                .ok_or(overflow.clone())?;
            units = units.checked_add(l.cantidad).ok_or(overflow.clone())?;
            cents = cents.checked_add(value).ok_or(overflow)?;
        }
        Ok(Self {
            order_id: order.id,
            market: order.mercado,
            units,
            cents,
        })
    }
}

/// The sales of one market in one batch: the payload (`datos`) of `ventas.mercado`, as its
/// contract has it.
pub use crate::contracts::sales::MarketSales;

/// Groups sales by market, each market's orders in the order given; totals saturate rather
/// than wrap (a batch that large is not a real one).
pub fn per_market(sales: &[Sale]) -> BTreeMap<String, MarketSales> {
    let mut out: BTreeMap<String, MarketSales> = BTreeMap::new();
    for sale in sales {
        let entry = out
            .entry(sale.market.clone())
            .or_insert_with(|| MarketSales {
                market: sale.market.clone(),
                orders: Vec::new(),
                units: 0,
                amount_cents: 0,
            });
        entry.orders.push(sale.order_id.clone());
        entry.units = entry.units.saturating_add(sale.units);
        entry.amount_cents = entry.amount_cents.saturating_add(sale.cents);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn from_payload(datos: Value) -> Result<Sale, SaleError> {
        Sale::from_envelope(&Envelope::new("pedido.creado", "pedidos", datos))
    }

    #[test]
    fn an_order_is_worth_its_lines() {
        let sale = from_payload(json!({
            "id": "P-1", "cliente": "ana", "mercado": "girona",
            "lineas": [
                {"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450},
                {"producto": "tomate-rosa", "cantidad": 3, "precio_centimos": 200}
            ]
        }));
        assert_eq!(
            sale,
            Ok(Sale {
                order_id: "P-1".into(),
                market: "girona".into(),
                units: 5,
                cents: 3500
            })
        );
    }

    #[test]
    fn payloads_that_are_not_orders_are_refused() {
        assert!(matches!(
            from_payload(json!({"id": "P-1", "lineas": []})),
            Err(SaleError::Contract(_))
        ));
        assert!(matches!(
            from_payload(json!("texto")),
            Err(SaleError::Contract(_))
        ));
        let negative = json!({"id": "P", "mercado": "m",
            "lineas": [{"cantidad": -1, "precio_centimos": 5}]});
        assert!(matches!(
            from_payload(negative),
            Err(SaleError::BadLine { line: 0, .. })
        ));
        let huge = json!({"id": "P", "mercado": "m",
            "lineas": [{"cantidad": i64::MAX, "precio_centimos": 2}]});
        assert!(matches!(
            from_payload(huge),
            Err(SaleError::BadLine { line: 0, .. })
        ));
    }

    #[test]
    fn a_batch_is_summed_per_market_in_order() {
        let sale = |id: &str, market: &str, cents| Sale {
            order_id: id.into(),
            market: market.into(),
            units: 1,
            cents,
        };
        let markets = per_market(&[
            sale("P-1", "girona", 100),
            sale("P-2", "reus", 50),
            sale("P-3", "girona", 25),
        ]);
        assert_eq!(markets.len(), 2);
        assert_eq!(markets["girona"].orders, vec!["P-1", "P-3"]);
        assert_eq!(markets["girona"].amount_cents, 125);
        assert_eq!(markets["girona"].units, 2);
        assert_eq!(markets["reus"].orders, vec!["P-2"]);
    }
}
