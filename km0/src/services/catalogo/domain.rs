//! What catalogo reads from a `stock.actualizado`, and when a product is low on stock.

use serde_json::Value;

/// Below this many units a product is shown as low on stock (`despues < 5`, the seed's rule).
pub const LOW_STOCK: i64 = 5;

/// A product's new units, from `stock.actualizado` `{producto, antes, despues, motivo}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockChange {
    /// The product.
    pub product: String,
    /// Its units after the change.
    pub after: i64,
}

/// A `stock.actualizado` whose `datos` catalogo cannot read (permanent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stock.actualizado no válido: {0}")]
pub struct InvalidChange(pub String);

impl StockChange {
    /// Reads the event's `datos`; unknown fields are ignored.
    pub fn from_payload(data: &Value) -> Result<Self, InvalidChange> {
        let product = match data.get("producto") {
            Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= 200 => s.clone(),
            _ => return Err(InvalidChange("producto falta o no es un texto".into())),
        };
        let after = data
            .get("despues")
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0)
            .ok_or_else(|| InvalidChange("despues debe ser un entero >= 0".into()))?;
        Ok(Self { product, after })
    }

    /// Whether the product is low on stock after the change.
    pub fn is_low(&self) -> bool {
        self.after < LOW_STOCK
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_seed_event_and_flags_low_stock() {
        let data =
            json!({"producto": "queso-curado", "antes": 5, "despues": 4, "motivo": "pedido"});
        let change = StockChange::from_payload(&data).unwrap();
        assert_eq!(change.after, 4);
        assert!(change.is_low());
        let plenty = json!({"producto": "vino", "despues": 5});
        assert!(!StockChange::from_payload(&plenty).unwrap().is_low());
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for data in [
            json!({}),
            json!({"producto": "x"}),
            json!({"producto": "x", "despues": -1}),
        ] {
            assert!(StockChange::from_payload(&data).is_err(), "{data}");
        }
    }
}
