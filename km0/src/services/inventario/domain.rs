//! Stock rules: what a `pedido.creado` asks of the stock, and why it can be refused.

use serde_json::Value;

/// The seed's initial stock, inserted once by the first migration.
pub const INITIAL_STOCK: &[(&str, i64)] = &[
    ("tomate-rosa", 120),
    ("calabacin", 80),
    ("queso-curado", 5),
    ("queso-fresco", 30),
    ("vino-crianza", 200),
];

/// Units of one product that an order takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockLine {
    /// Product id (`producto`).
    pub product: String,
    /// Units to take (`cantidad`), at least 1.
    pub quantity: i32,
}

/// What inventario needs from a `pedido.creado`: the order id and its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedOrder {
    /// Order id (`datos.id`), for messages and logs.
    pub order_id: String,
    /// Lines (`datos.lineas`), in order.
    pub lines: Vec<StockLine>,
    /// The reservation an order saga asks for by command (`datos.reserva`): when present,
    /// the stock is taken by that command, not by this event.
    pub reservation: Option<String>,
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
    /// The event's `datos` is not an order.
    #[error("evento inválido, campo `{field}`: {reason}")]
    InvalidEvent {
        /// The field at fault, as a path in `datos`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl StockError {
    /// A short, fixed code for the refusal, for counting dead letters
    /// ([`entrega::HandlerError::with_code`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::OutOfStock { .. } => "sin_stock",
            Self::UnknownProduct { .. } => "producto_desconocido",
            Self::InvalidEvent { .. } => "evento_invalido",
        }
    }

    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidEvent {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl PlacedOrder {
    /// Reads the `datos` of a `pedido.creado`. Unknown fields are ignored, as the envelope's
    /// compatibility rules require; missing or ill-typed ones are a permanent error.
    pub fn from_payload(data: &Value) -> Result<Self, StockError> {
        let order_id = match data.get("id") {
            Some(Value::String(s)) => s.clone(),
            // Ids are usually text, but a producer that sends a number still names an order.
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err(StockError::invalid("id", "falta o no es un texto")),
        };
        let lines = lines_of(data)?;
        let reservation = data
            .get("reserva")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .map(str::to_owned);
        Ok(Self {
            order_id,
            lines,
            reservation,
        })
    }
}

/// `lines` as `lineas` are written (the inverse of [`lines_of`]): `[{"producto", "cantidad"}]`.
pub(super) fn lines_value(lines: &[StockLine]) -> Value {
    Value::Array(
        lines
            .iter()
            .map(|l| serde_json::json!({"producto": l.product, "cantidad": l.quantity}))
            .collect(),
    )
}

/// The `lineas` of an order or a reservation: each `{"producto", "cantidad" > 0}`.
pub(super) fn lines_of(data: &Value) -> Result<Vec<StockLine>, StockError> {
    let Some(Value::Array(items)) = data.get("lineas") else {
        return Err(StockError::invalid("lineas", "falta o no es una lista"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let product = item
                .get("producto")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    StockError::invalid(format!("lineas[{i}].producto"), "falta o no es un texto")
                })?;
            // A non-positive quantity would *add* stock: refuse it rather than apply it.
            let quantity = item
                .get("cantidad")
                .and_then(Value::as_i64)
                .and_then(|q| i32::try_from(q).ok())
                .filter(|q| *q > 0)
                .ok_or_else(|| {
                    StockError::invalid(
                        format!("lineas[{i}].cantidad"),
                        "debe ser un entero mayor que 0",
                    )
                })?;
            Ok(StockLine {
                product: product.to_owned(),
                quantity,
            })
        })
        .collect::<Result<Vec<_>, StockError>>()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_seed_payload_and_ignores_unknown_fields() {
        let order = PlacedOrder::from_payload(&json!({
            "id": "P-2026-000123", "cliente": "ana", "extra": {"x": 1},
            "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}]
        }))
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

    #[test]
    fn refuses_quantities_that_would_add_stock() {
        let err = PlacedOrder::from_payload(&json!({
            "id": "P", "lineas": [{"producto": "calabacin", "cantidad": -3}]
        }))
        .unwrap_err();
        assert!(
            matches!(err, StockError::InvalidEvent { ref field, .. } if field == "lineas[0].cantidad")
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
