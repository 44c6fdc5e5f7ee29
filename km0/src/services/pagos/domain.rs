//! pagos' rules: card authorisations (the seed's request/reply contract) and what an order
//! is charged.

use entrega::{ContractError, Event, View};
use entrega_core::Envelope;
use serde::Deserialize;
use serde_json::Value;

use crate::contracts;
use crate::contracts::payments::{self, AuthorisationReply};

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
    /// Reads the seed's request body (its contract, [`payments::AuthorisationRequest`]).
    pub fn from_json(body: &[u8]) -> Result<Self, InvalidRequest> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| InvalidRequest(format!("JSON: {e}")))?;
        let request = entrega::contracts::read::<payments::AuthorisationRequest>(value)
            .map_err(|e| InvalidRequest(e.to_string()))?;
        if request.order_id.trim().is_empty() || request.order_id.len() > 200 {
            return Err(InvalidRequest("pedido_id falta o no es un texto".into()));
        }
        if request.amount_cents < 1 {
            return Err(InvalidRequest(
                "importe_centimos debe ser un entero >= 1".into(),
            ));
        }
        Ok(Self {
            order_id: request.order_id,
            amount_cents: request.amount_cents,
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

/// What pagos reads of a `pedido.creado`: versions 1 and 2 carry it alike.
#[derive(Debug, Clone, Deserialize)]
pub struct OrderForPayment {
    /// The order (`id`).
    pub id: String,
    /// Customer (`cliente`), whose card on file is charged without `tarjeta`.
    #[serde(rename = "cliente")]
    pub customer: String,
    /// Lines (`lineas`): what each costs.
    #[serde(rename = "lineas")]
    pub lines: Vec<PricedLine>,
    /// The card token (`tarjeta`).
    #[serde(rename = "tarjeta", default)]
    pub card: Option<String>,
    /// Under the saga: the key the saga charges the order by (`cobro`).
    #[serde(rename = "cobro", default)]
    pub charge: Option<String>,
}

/// What one line costs: `cantidad` × `precio_centimos`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PricedLine {
    /// Units (`cantidad`).
    #[serde(rename = "cantidad")]
    pub quantity: i64,
    /// Unit price in cents (`precio_centimos`).
    #[serde(rename = "precio_centimos")]
    pub price_cents: i64,
}

impl View for OrderForPayment {
    const TIPO: &'static str = crate::services::pedidos::ORDER_CREATED;
    const VERSIONS: &'static [u32] = &[1, 2];
}

impl OrderForPayment {
    /// Reads a `pedido.creado` (an older version through km0's upcasters).
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, ContractError> {
        contracts::upcasters().decode(envelope)
    }
}

impl OrderToCharge {
    /// What `order` is charged, on which card.
    pub fn from_order(order: &OrderForPayment) -> Result<Self, NotChargeable> {
        if order.id.trim().is_empty() {
            return Err(NotChargeable("falta datos.id".into()));
        }
        let mut amount_cents: i64 = 0;
        for line in &order.lines {
            amount_cents = line
                .quantity
                .checked_mul(line.price_cents)
                .and_then(|v| amount_cents.checked_add(v))
                .ok_or_else(|| NotChargeable("el importe no cabe en 64 bits".into()))?;
        }
        if amount_cents <= 0 {
            return Err(NotChargeable(format!("importe de {amount_cents} céntimos")));
        }
        let card = match order.card.as_deref().filter(|c| !c.trim().is_empty()) {
            Some(card) => card.to_owned(),
            None if !order.customer.trim().is_empty() => format!("tok_{}", order.customer),
            None => return Err(NotChargeable("sin tarjeta ni cliente".into())),
        };
        Ok(Self {
            order_id: order.id.clone(),
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
        let order =
            OrderToCharge::from_order(&OrderForPayment::from_envelope(&envelope).unwrap()).unwrap();
        assert_eq!(order.amount_cents, 3400);
        assert_eq!(order.card, "tok_ana");
        assert_eq!(order.charge_key(), "cobro-P-1");
        let free = Envelope::new(
            "pedido.creado",
            "pedidos",
            serde_json::json!({"id": "P-2", "cliente": "x", "lineas": [
                {"producto": "q", "cantidad": 1, "precio_centimos": 0}]}),
        );
        assert!(
            OrderToCharge::from_order(&OrderForPayment::from_envelope(&free).unwrap()).is_err()
        );
    }
}
