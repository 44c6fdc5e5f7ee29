//! Stock rules: what a `pedido.creado` asks of the stock, and why it can be refused.

use entrega::{ContractError, View};
use entrega_core::Envelope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contracts;

/// The seed's initial stock, inserted once by the first migration.
pub const INITIAL_STOCK: &[(&str, i64)] = &[
    ("tomate-rosa", 120),
    ("calabacin", 80),
    ("queso-curado", 5),
    ("queso-fresco", 30),
    ("vino-crianza", 200),
];

/// Longest product id accepted, in bytes.
const MAX_PRODUCT_LEN: usize = 200;

/// Units of one product that an order takes (`{"producto", "cantidad"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockLine {
    /// Product id (`producto`).
    #[serde(rename = "producto")]
    pub product: String,
    /// Units to take (`cantidad`), at least 1.
    #[serde(rename = "cantidad")]
    pub quantity: i32,
}

/// What inventario reads of a `pedido.creado`: the order id, its lines and, under the saga,
/// its reservation. Versions 1 and 2 carry these alike, so both are read as they are.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PlacedOrder {
    /// Order id (`datos.id`), for messages and logs.
    #[serde(rename = "id")]
    pub order_id: String,
    /// Lines (`datos.lineas`), in order.
    #[serde(rename = "lineas")]
    pub lines: Vec<StockLine>,
    /// The reservation an order saga asks for by command (`datos.reserva`): when present,
    /// the stock is taken by that command, not by this event.
    #[serde(rename = "reserva", default)]
    pub reservation: Option<String>,
}

impl View for PlacedOrder {
    const TIPO: &'static str = crate::services::pedidos::ORDER_CREATED;
    const VERSIONS: &'static [u32] = &[1, 2];
}

/// Why an order's stock cannot be taken. Every variant is permanent: the same message will
/// fail the same way however often it is retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StockError {
    /// Not enough units left (the seed's `StockInsuficiente`).
    #[error("sin stock de {product}")]
    OutOfStock {
        /// The product.
        product: String,
    },
    /// The product is not in the stock table.
    #[error("producto desconocido: {product}")]
    UnknownProduct {
        /// The product.
        product: String,
    },
    /// The message does not meet its contract (a version with no path to one inventario
    /// reads, a member missing or out of range): a dead letter of class `esquema`.
    #[error(transparent)]
    Contract(#[from] ContractError),
}

impl StockError {
    /// A short, fixed code for the refusal, for counting dead letters
    /// ([`entrega::HandlerError::with_code`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::OutOfStock { .. } => "sin_stock",
            Self::UnknownProduct { .. } => "producto_desconocido",
            Self::Contract(_) => "esquema",
        }
    }

    /// The error as the worker classifies it: a contract failure is a dead letter of class
    /// `esquema`, the others are refused; all permanent, each with its code.
    pub fn into_handler_error(self) -> entrega::HandlerError {
        let code = self.code();
        match self {
            Self::Contract(e) => entrega::HandlerError::contract(e).with_code(code),
            other => entrega::HandlerError::permanent(other).with_code(code),
        }
    }
}

impl PlacedOrder {
    /// Reads a `pedido.creado` (version 1 or 2, or an older one through km0's upcasters).
    /// Unknown members are ignored, as the envelope's compatibility rules require; missing
    /// or ill-typed ones, and quantities below 1, are a contract error naming the member.
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, StockError> {
        let order: Self = contracts::upcasters().decode(envelope)?;
        check_lines(Self::TIPO, envelope.version, &order.lines)?;
        Ok(order)
    }
}

/// Refuses lines a contract type cannot: an empty or overlong product, and a quantity below
/// 1, which would *add* stock.
pub(super) fn check_lines(
    tipo: &str,
    version: u32,
    lines: &[StockLine],
) -> Result<(), ContractError> {
    let invalid = |field: String, reason: &str| ContractError::Invalid {
        tipo: tipo.to_owned(),
        version,
        field,
        reason: reason.to_owned(),
    };
    for (i, line) in lines.iter().enumerate() {
        if line.product.trim().is_empty() || line.product.len() > MAX_PRODUCT_LEN {
            return Err(invalid(
                format!("lineas[{i}].producto"),
                "must be a product id of 1 to 200 characters",
            ));
        }
        if line.quantity < 1 {
            return Err(invalid(
                format!("lineas[{i}].cantidad"),
                "must be at least 1",
            ));
        }
    }
    Ok(())
}

/// `lines` as stored in `reservas.lineas`: `[{"producto", "cantidad"}]`.
pub(super) fn lines_value(lines: &[StockLine]) -> Value {
    serde_json::to_value(lines).unwrap_or(Value::Null)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn created(version: u32, datos: Value) -> Envelope {
        let mut envelope = Envelope::new("pedido.creado", "pedidos", datos);
        envelope.version = version;
        envelope
    }

    #[test]
    fn reads_the_seed_payload_and_ignores_unknown_fields() {
        for version in [1, 2] {
            let order = PlacedOrder::from_envelope(&created(
                version,
                json!({
                    "id": "P-2026-000123", "cliente": "ana", "extra": {"x": 1},
                    "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}]
                }),
            ))
            .unwrap();
            assert_eq!(order.order_id, "P-2026-000123");
            assert_eq!(
                order.lines,
                vec![StockLine {
                    product: "queso-curado".into(),
                    quantity: 2
                }]
            );
        }
    }

    #[test]
    fn a_version_it_cannot_read_is_a_contract_error() {
        let err =
            PlacedOrder::from_envelope(&created(3, json!({"id": "P", "lineas": []}))).unwrap_err();
        assert!(
            matches!(err, StockError::Contract(ContractError::Newer { .. })),
            "{err}"
        );
        assert_eq!(
            err.into_handler_error().dead_class(),
            entrega_core::DeadClass::Schema
        );
    }

    #[test]
    fn refuses_quantities_that_would_add_stock() {
        let err = PlacedOrder::from_envelope(&created(
            2,
            json!({"id": "P", "lineas": [{"producto": "calabacin", "cantidad": -3}]}),
        ))
        .unwrap_err();
        assert!(
            matches!(err, StockError::Contract(ContractError::Invalid { ref field, .. }) if field == "lineas[0].cantidad"),
            "{err}"
        );
    }

    #[test]
    fn out_of_stock_reads_as_in_the_seed() {
        let err = StockError::OutOfStock {
            product: "queso-curado".into(),
        };
        assert_eq!(err.to_string(), "sin stock de queso-curado");
    }
}
