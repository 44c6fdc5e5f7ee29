//! pagos' rules: card authorisations (the seed's request/reply contract) and what an order
//! is charged.

use entrega::{ContractError, Event};
use entrega_core::Envelope;

use crate::contracts::payments::AuthorisationReply;
use serde_json::Value;

/// Largest amount pagos authorises, in cents (500 €).
pub const AUTHORISATION_LIMIT_CENTS: i64 = 50_000;

/// A request on `pagos.autorizaciones`: `{"pedido_id", "importe_centimos"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorisationRequest {
    /// The order.
    pub order_id: String,
    /// Amount in cents, at least 1.
    pub amount_cents: i64,
}

/// A body that is not an authorisation request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("petición de autorización no válida: {0}")]
pub struct InvalidRequest(pub String);

impl AuthorisationRequest {
    /// Reads the seed's request body.
    pub fn from_json(body: &[u8]) -> Result<Self, InvalidRequest> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| InvalidRequest(format!("JSON: {e}")))?;
        let order_id = match value.get("pedido_id") {
            Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= 200 => s.clone(),
            _ => return Err(InvalidRequest("pedido_id falta o no es un texto".into())),
        };
        let amount_cents = match value.get("importe_centimos").and_then(Value::as_i64) {
            Some(n) if n >= 1 => n,
            _ => {
                return Err(InvalidRequest(
                    "importe_centimos debe ser un entero >= 1".into(),
                ))
            }
        };
        Ok(Self {
            order_id,
            amount_cents,
        })
    }

    /// The key a repeat of this request is known by.
    pub fn key(&self) -> String {
        format!("autorizacion-{}", self.order_id)
    }
}

/// The answer to an authorisation: `{"pedido_id", "autorizado": true, "id_autorizacion"}` or
/// `{"pedido_id", "autorizado": false, "motivo"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorisation {
    /// Authorised, with the authorisation's id.
    Granted(String),
    /// Refused, with why.
    Refused(String),
}

impl Authorisation {
    /// The decision on `request`: amounts up to [`AUTHORISATION_LIMIT_CENTS`] are authorised.
    pub fn decide(request: &AuthorisationRequest) -> Self {
        if request.amount_cents > AUTHORISATION_LIMIT_CENTS {
            Self::Refused("importe_excede_limite".into())
        } else {
            Self::Granted(format!("AUT-{}", uuid::Uuid::new_v4().simple()))
        }
    }

    /// The reply for order `order_id`, as its contract has it.
    pub fn reply(&self, order_id: &str) -> AuthorisationReply {
        let (granted, authorisation_id, reason) = match self {
            Self::Granted(id) => (true, Some(id.clone()), None),
            Self::Refused(reason) => (false, None, Some(reason.clone())),
        };
        AuthorisationReply {
            order_id: order_id.to_owned(),
            granted,
            authorisation_id,
            reason,
        }
    }

    /// The reply body for order `order_id`.
    pub fn to_json(&self, order_id: &str) -> Result<Value, ContractError> {
        self.reply(order_id).datos()
    }
}

/// An order to charge, read from its `pedido.creado`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderToCharge {
    /// The order.
    pub order_id: String,
    /// Σ cantidad × precio_centimos.
    pub amount_cents: i64,
    /// The card token: the order's `tarjeta`, or the customer's card on file
    /// (`tok_<cliente>`).
    pub card: String,
}

/// A `pedido.creado` pagos cannot charge (a permanent error: it is dead-lettered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pedido.creado no cobrable: {0}")]
pub struct NotChargeable(pub String);

impl OrderToCharge {
    /// Reads `datos` of a `pedido.creado`.
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, NotChargeable> {
        let data = &envelope.data;
        let text = |name: &str| {
            data.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_owned)
        };
        let order_id = text("id").ok_or_else(|| NotChargeable("falta datos.id".into()))?;
        let lines = data
            .get("lineas")
            .and_then(Value::as_array)
            .ok_or_else(|| NotChargeable("falta datos.lineas".into()))?;
        let mut amount_cents: i64 = 0;
        for (i, line) in lines.iter().enumerate() {
            let quantity = line.get("cantidad").and_then(Value::as_i64);
            let price = line.get("precio_centimos").and_then(Value::as_i64);
            let (Some(q), Some(p)) = (quantity, price) else {
                return Err(NotChargeable(format!("lineas[{i}] sin cantidad o precio")));
            };
            amount_cents = q
                .checked_mul(p)
                .and_then(|v| amount_cents.checked_add(v))
                .ok_or_else(|| NotChargeable("el importe no cabe en 64 bits".into()))?;
        }
        if amount_cents <= 0 {
            return Err(NotChargeable(format!("importe de {amount_cents} céntimos")));
        }
        let card = match text("tarjeta") {
            Some(card) => card,
            None => format!(
                "tok_{}",
                text("cliente").ok_or_else(|| NotChargeable("sin tarjeta ni cliente".into()))?
            ),
        };
        Ok(Self {
            order_id,
            amount_cents,
            card,
        })
    }

    /// The gateway's Idempotency-Key for this order's charge: `cobro-<pedido_id>`, the same on
    /// every retry and redelivery.
    pub fn charge_key(&self) -> String {
        format!("cobro-{}", self.order_id)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_and_decide_as_the_seed_expects() {
        let r = AuthorisationRequest::from_json(br#"{"pedido_id":"P-1","importe_centimos":1250}"#)
            .unwrap();
        assert_eq!(r.key(), "autorizacion-P-1");
        let granted = Authorisation::decide(&r).to_json("P-1").unwrap();
        assert_eq!(granted["autorizado"], true);
        assert!(granted["id_autorizacion"]
            .as_str()
            .unwrap()
            .starts_with("AUT-"));
        let big = AuthorisationRequest {
            order_id: "P-2".into(),
            amount_cents: AUTHORISATION_LIMIT_CENTS + 1,
        };
        let refused = Authorisation::decide(&big).to_json("P-2").unwrap();
        assert_eq!(refused["autorizado"], false);
        assert_eq!(refused["motivo"], "importe_excede_limite");
        assert!(AuthorisationRequest::from_json(b"{\"importe_centimos\":5}").is_err());
        assert!(AuthorisationRequest::from_json(b"not json").is_err());
    }

    #[test]
    fn orders_are_charged_their_lines_on_their_card_or_the_customers() {
        let envelope = Envelope::new(
            "pedido.creado",
            "pedidos",
            serde_json::json!({"id": "P-1", "cliente": "ana", "lineas": [
                {"producto": "queso", "cantidad": 2, "precio_centimos": 1250},
                {"producto": "vino", "cantidad": 1, "precio_centimos": 900}]}),
        );
        let order = OrderToCharge::from_envelope(&envelope).unwrap();
        assert_eq!(order.amount_cents, 3400);
        assert_eq!(order.card, "tok_ana");
        assert_eq!(order.charge_key(), "cobro-P-1");
        let free = Envelope::new(
            "pedido.creado",
            "pedidos",
            serde_json::json!({"id": "P-2", "cliente": "x", "lineas": [
                {"producto": "q", "cantidad": 1, "precio_centimos": 0}]}),
        );
        assert!(OrderToCharge::from_envelope(&free).is_err());
    }
}
