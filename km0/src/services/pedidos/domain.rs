//! Orders as the API receives and returns them, and the validation of a new order.
//!
//! Wire names are the seed's (`cliente`, `mercado`, `lineas`, `producto`, `cantidad`,
//! `precio_centimos`); the payload of `pedido.creado` is the order exactly as received, as the
//! seed's `json.dumps(pedido)` publishes it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::services::input::{id_problem, text_problem};

/// Longest accepted free-text field (the address's city and street), in characters.
/// Identifiers (order, customer, market, product, card) follow
/// [`crate::services::input::id_problem`].
pub const MAX_TEXT_LEN: usize = 200;
/// Most lines accepted in one order.
pub const MAX_LINES: usize = 200;

/// Where an order stands (`estado`), stored and sent by its Spanish name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum OrderState {
    /// Just created (`creado`), as the seed's `crear_pedido` stores it.
    #[serde(rename = "creado")]
    Created,
    /// Paid (`pagado`).
    #[serde(rename = "pagado")]
    Paid,
    /// Cancelled (`cancelado`).
    #[serde(rename = "cancelado")]
    Cancelled,
}

impl OrderState {
    /// The name stored in `pedidos.estado`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "creado",
            Self::Paid => "pagado",
            Self::Cancelled => "cancelado",
        }
    }

    /// The state stored as `name`, if km0 knows it.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Created, Self::Paid, Self::Cancelled]
            .into_iter()
            .find(|state| state.as_str() == name)
    }
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderLine {
    /// Product id (`producto`), e.g. `queso-curado`.
    #[serde(rename = "producto")]
    pub product: String,
    /// Units ordered (`cantidad`), at least 1.
    #[serde(rename = "cantidad")]
    pub quantity: i32,
    /// Unit price in cents (`precio_centimos`), at least 0.
    #[serde(rename = "precio_centimos")]
    pub price_cents: i32,
}

/// An order to create, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NewOrder {
    /// Order id chosen by the client, e.g. `P-2026-000123`: 1 to 64 of `A-Z a-z 0-9 . _ : -`,
    /// starting with a letter or digit (as customer, market, product and card ids). The same
    /// order sent again gets the original answer, another order under the same id is a
    /// conflict.
    pub id: String,
    /// Customer (`cliente`).
    #[serde(rename = "cliente")]
    pub customer: String,
    /// Market the order is for (`mercado`).
    #[serde(rename = "mercado")]
    pub market: String,
    /// Lines (`lineas`), at least one.
    #[serde(rename = "lineas")]
    pub lines: Vec<OrderLine>,
    /// The card token to charge (`tarjeta`); without one, pagos charges the customer's card
    /// on file.
    #[serde(rename = "tarjeta", default, skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    /// Where to deliver it (`direccion_entrega`); the order saga needs it to assign a courier.
    #[serde(
        rename = "direccion_entrega",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub address: Option<Address>,
}

/// A delivery address: `{"ciudad", "codigo_postal", "calle"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Address {
    /// City (`ciudad`).
    #[serde(rename = "ciudad")]
    pub city: String,
    /// Postal code (`codigo_postal`), five digits.
    #[serde(rename = "codigo_postal")]
    pub postal_code: String,
    /// Street (`calle`).
    #[serde(rename = "calle")]
    pub street: String,
}

/// A stored order with its lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Order {
    /// Order id.
    pub id: String,
    /// Customer (`cliente`).
    #[serde(rename = "cliente")]
    pub customer: String,
    /// Market (`mercado`).
    #[serde(rename = "mercado")]
    pub market: String,
    /// State (`estado`), `creado` for a new order.
    #[serde(rename = "estado")]
    pub state: OrderState,
    /// Creation time (`creado_en`), RFC 3339 in UTC.
    #[serde(rename = "creado_en")]
    pub created_at: String,
    /// Lines (`lineas`), in insertion order.
    #[serde(rename = "lineas")]
    pub lines: Vec<OrderLine>,
    /// Why it was cancelled (`motivo`), when the order saga cancelled it: the step that
    /// refused and its answer (`ciudad_no_cubierta: Lleida`, `cancelado por el cliente`).
    #[serde(rename = "motivo", default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why a request body is not a valid order; names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidOrder {
    /// The field, as a path in the body: `cliente`, `lineas`, `lineas[1].cantidad`.
    pub field: String,
    /// What is wrong with it, for the client.
    pub message: String,
}

impl InvalidOrder {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A request body as it came: every member optional, so a missing one is named by the
/// validation rather than by serde.
#[derive(Deserialize)]
struct OrderInput {
    id: Option<String>,
    cliente: Option<String>,
    mercado: Option<String>,
    lineas: Option<Vec<LineInput>>,
    tarjeta: Option<String>,
    direccion_entrega: Option<AddressInput>,
}

#[derive(Deserialize)]
struct LineInput {
    producto: Option<String>,
    cantidad: Option<i64>,
    precio_centimos: Option<i64>,
}

#[derive(Deserialize)]
struct AddressInput {
    ciudad: Option<String>,
    codigo_postal: Option<String>,
    calle: Option<String>,
}

impl NewOrder {
    /// Validates a JSON body member by member, so the client learns exactly which one is
    /// wrong: its type (read by serde, which names the path), then the business rules.
    pub fn from_json(body: &Value) -> Result<Self, InvalidOrder> {
        if !body.is_object() {
            return Err(InvalidOrder::new(
                "cuerpo",
                "the body must be a JSON object",
            ));
        }
        let input: OrderInput = serde_path_to_error::deserialize(body).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "cuerpo".to_owned()
            } else {
                path
            };
            InvalidOrder::new(field, e.into_inner().to_string())
        })?;
        let id = identifier(input.id, "id")?;
        let customer = identifier(input.cliente, "cliente")?;
        let market = identifier(input.mercado, "mercado")?;
        let Some(lines) = input.lineas else {
            return Err(InvalidOrder::new("lineas", MISSING));
        };
        if lines.is_empty() {
            return Err(InvalidOrder::new(
                "lineas",
                "an order needs at least one line",
            ));
        }
        if lines.len() > MAX_LINES {
            return Err(InvalidOrder::new(
                "lineas",
                format!("at most {MAX_LINES} lines per order"),
            ));
        }
        let lines = lines
            .into_iter()
            .enumerate()
            .map(|(i, line)| {
                let path = |name: &str| format!("lineas[{i}].{name}");
                Ok(OrderLine {
                    product: identifier(line.producto, &path("producto"))?,
                    quantity: integer(line.cantidad, &path("cantidad"), 1)?,
                    price_cents: integer(line.precio_centimos, &path("precio_centimos"), 0)?,
                })
            })
            .collect::<Result<Vec<_>, InvalidOrder>>()?;
        let card = match input.tarjeta {
            None => None,
            some => Some(identifier(some, "tarjeta")?),
        };
        let address = match input.direccion_entrega {
            None => None,
            Some(a) => Some(Address {
                city: text(a.ciudad, "direccion_entrega.ciudad")?,
                postal_code: postal_code(a.codigo_postal)?,
                street: text(a.calle, "direccion_entrega.calle")?,
            }),
        };
        Ok(Self {
            id,
            customer,
            market,
            lines,
            card,
            address,
        })
    }

    /// The payload (`carga`) of `pedido.creado`: the order as the client sent it.
    pub fn to_payload(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// What the order costs: Σ cantidad × precio_centimos (saturating).
    pub fn amount_cents(&self) -> i64 {
        self.lines.iter().fold(0i64, |sum, l| {
            sum.saturating_add(i64::from(l.quantity).saturating_mul(i64::from(l.price_cents)))
        })
    }

    /// Total units of all lines.
    pub fn units(&self) -> i64 {
        self.lines.iter().map(|l| i64::from(l.quantity)).sum()
    }
}

/// The message of a member the body lacks.
const MISSING: &str = "missing";

fn text(value: Option<String>, path: &str) -> Result<String, InvalidOrder> {
    match value {
        None => Err(InvalidOrder::new(path, MISSING)),
        Some(s) if s.trim().is_empty() => Err(InvalidOrder::new(path, "must not be empty")),
        Some(s) if s.chars().count() > MAX_TEXT_LEN => Err(InvalidOrder::new(
            path,
            format!("at most {MAX_TEXT_LEN} characters"),
        )),
        Some(s) => match text_problem(&s) {
            Some(problem) => Err(InvalidOrder::new(path, problem)),
            None => Ok(s),
        },
    }
}

fn identifier(value: Option<String>, path: &str) -> Result<String, InvalidOrder> {
    let Some(value) = value else {
        return Err(InvalidOrder::new(path, MISSING));
    };
    match id_problem(&value) {
        Some(problem) => Err(InvalidOrder::new(path, problem)),
        None => Ok(value),
    }
}

fn postal_code(value: Option<String>) -> Result<String, InvalidOrder> {
    const PATH: &str = "direccion_entrega.codigo_postal";
    let code = text(value, PATH)?;
    if code.len() == 5 && code.bytes().all(|b| b.is_ascii_digit()) {
        Ok(code)
    } else {
        Err(InvalidOrder::new(PATH, "must be five digits"))
    }
}

fn integer(value: Option<i64>, path: &str, min: i32) -> Result<i32, InvalidOrder> {
    let Some(number) = value else {
        return Err(InvalidOrder::new(path, MISSING));
    };
    if number < i64::from(min) {
        return Err(InvalidOrder::new(path, format!("must be at least {min}")));
    }
    i32::try_from(number)
        .map_err(|_| InvalidOrder::new(path, format!("must be less than {}", i32::MAX)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn valid() -> Value {
        json!({"id": "P-1", "cliente": "ana", "mercado": "girona",
               "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}]})
    }

    #[test]
    fn a_valid_order_round_trips_to_the_seed_payload() {
        let order = NewOrder::from_json(&valid()).unwrap();
        assert_eq!(order.lines[0].quantity, 2);
        assert_eq!(order.to_payload(), valid());
    }

    #[test]
    fn each_problem_names_its_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!([]), "cuerpo"),
            (json!({"cliente": "a", "mercado": "m", "lineas": []}), "id"),
            (
                json!({"id": " ", "cliente": "a", "mercado": "m", "lineas": []}),
                "id",
            ),
            (
                json!({"id": "P", "cliente": 3, "mercado": "m", "lineas": []}),
                "cliente",
            ),
            (json!({"id": "P", "cliente": "a", "lineas": []}), "mercado"),
            (
                json!({"id": "P", "cliente": "a", "mercado": "m", "lineas": []}),
                "lineas",
            ),
            (json!({"id": "P", "cliente": "a", "mercado": "m"}), "lineas"),
            (
                json!({"id": "P", "cliente": "a", "mercado": "m",
                       "lineas": [{"producto": "x", "cantidad": 1, "precio_centimos": 1},
                                  {"producto": "y", "cantidad": 0, "precio_centimos": 1}]}),
                "lineas[1].cantidad",
            ),
            (
                json!({"id": "P", "cliente": "a", "mercado": "m",
                       "lineas": [{"producto": "x", "cantidad": 1.5, "precio_centimos": 1}]}),
                "lineas[0].cantidad",
            ),
            (
                json!({"id": "P", "cliente": "a", "mercado": "m",
                       "lineas": [{"producto": "x", "cantidad": 1, "precio_centimos": -1}]}),
                "lineas[0].precio_centimos",
            ),
            (
                json!({"id": "P", "cliente": "a", "mercado": "m",
                       "lineas": [{"cantidad": 1, "precio_centimos": 1}]}),
                "lineas[0].producto",
            ),
        ];
        for (body, field) in cases {
            let err = NewOrder::from_json(&body).unwrap_err();
            assert_eq!(err.field, field, "{body}");
        }
    }
}
