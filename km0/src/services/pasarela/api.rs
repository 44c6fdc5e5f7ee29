//! The gateway's HTTP API as types: the bodies it reads and the answers it gives, shared by
//! the gateway (`pasarela`) and its client (`pagos`), and described in OpenAPI 3.1
//! ([`openapi`]).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::db::{Charge, Refund};

/// `POST /cargos`: charge a card. Members in the order of the canonical form the key's
/// fingerprint is taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChargeBody {
    /// Amount in cents, at least 1.
    #[schema(minimum = 1)]
    pub importe_centimos: i64,
    /// The merchant's reference (km0 sends the order id), 1 to 200 bytes.
    pub referencia: String,
    /// Card token, 1 to 200 bytes.
    pub tarjeta: String,
}

/// How a charge ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ChargeState {
    /// Charged (201).
    #[serde(rename = "aprobado")]
    Approved,
    /// Not charged (402), with `motivo`.
    #[serde(rename = "rechazado")]
    Declined,
}

/// The answer to a charge: 201 approved, 402 declined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChargeAnswer {
    /// Charge id (`ch_...`).
    pub id: String,
    /// How it ended.
    pub estado: ChargeState,
    /// Amount charged, when approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importe_centimos: Option<i64>,
    /// Why it was declined (`tarjeta_rechazada`, `importe_excesivo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub motivo: Option<String>,
    /// The merchant's reference.
    pub referencia: String,
}

/// `POST /reembolsos`: give back the charge made under the Idempotency-Key `clave_cargo`.
/// Members in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RefundBody {
    /// The key the charge was made under, 1 to 255 bytes.
    pub clave_cargo: String,
    /// The merchant's reference, 1 to 255 bytes.
    pub referencia: String,
}

/// How a refund ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum RefundState {
    /// Given back (201).
    #[serde(rename = "reembolsado")]
    Refunded,
    /// Nothing was charged under that key (200): nothing to give back.
    #[serde(rename = "sin_cargo")]
    NothingCharged,
}

/// The answer to a refund.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RefundAnswer {
    /// Refund id (`re_...`), when given back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// How it ended.
    pub estado: RefundState,
    /// The charge given back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cargo: Option<String>,
    /// Amount given back, in cents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importe_centimos: Option<i64>,
    /// The merchant's reference.
    pub referencia: String,
}

/// `GET /cargos?referencia=`: a reference's charges and refunds, for reconciling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct LedgerAnswer {
    /// Charges, approved and declined.
    pub cargos: Vec<Charge>,
    /// Refunds.
    pub reembolsos: Vec<Refund>,
}

/// Whether the gateway reaches its ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub estado: String,
}

/// An error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}
