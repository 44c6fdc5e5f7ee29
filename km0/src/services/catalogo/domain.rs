//! What catalogo reads from a `stock.actualizado`, and when a product is low on stock.

use entrega::{ContractError, HandlerError, View};
use entrega_core::Envelope;
use serde::Deserialize;

use crate::contracts;

/// Below this many units a product is shown as low on stock (`despues < 5`, the seed's rule).
pub const LOW_STOCK: i64 = 5;

/// A product's new units: what catalogo reads of a `stock.actualizado`
/// (`{producto, antes, despues, motivo}`); unknown members are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StockChange {
    /// The product (`producto`).
    #[serde(rename = "producto")]
    pub product: String,
    /// Its units after the change (`despues`).
    #[serde(rename = "despues")]
    pub after: i64,
}

impl View for StockChange {
    const TIPO: &'static str = crate::services::inventario::STOCK_UPDATED;
    const VERSIONS: &'static [u32] = &[1];
}

/// A `stock.actualizado` catalogo cannot apply (permanent).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidChange {
    /// It does not meet its contract: a dead letter of class `esquema`.
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// A product or a count no stock can have.
    #[error("stock.actualizado no válido: {0}")]
    Impossible(String),
}

impl InvalidChange {
    /// The error as the worker classifies it.
    pub fn into_handler_error(self) -> HandlerError {
        match self {
            Self::Contract(e) => HandlerError::contract(e),
            other => HandlerError::permanent(other),
        }
    }
}

impl StockChange {
    /// Reads a `stock.actualizado`.
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, InvalidChange> {
        let change: Self = contracts::upcasters().decode(envelope)?;
        if change.product.trim().is_empty() || change.product.len() > 200 {
            return Err(InvalidChange::Impossible(
                "producto falta o no es un texto".into(),
            ));
        }
        if change.after < 0 {
            return Err(InvalidChange::Impossible(
                "despues debe ser un entero >= 0".into(),
            ));
        }
        Ok(change)
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
    use serde_json::{json, Value};

    fn from_payload(datos: &Value) -> Result<StockChange, InvalidChange> {
        StockChange::from_envelope(&Envelope::new(
            "stock.actualizado",
            "inventario",
            datos.clone(),
        ))
    }

    #[test]
    fn reads_the_seed_event_and_flags_low_stock() {
        let data =
            json!({"producto": "queso-curado", "antes": 5, "despues": 4, "motivo": "pedido"});
        let change = from_payload(&data).unwrap();
        assert_eq!(change.after, 4);
        assert!(change.is_low());
        let plenty = json!({"producto": "vino", "despues": 5});
        assert!(!from_payload(&plenty).unwrap().is_low());
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for data in [
            json!({}),
            json!({"producto": "x"}),
            json!({"producto": "x", "despues": -1}),
        ] {
            assert!(from_payload(&data).is_err(), "{data}");
        }
    }
}
