//! `pagos.comandos` (the saga's charge and refund), `pagos.eventos` (their answers) and the
//! `pagos.autorizaciones` request/reply queue.

use entrega::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `pagos.cobrar`: charge an order once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Charge {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The charge's key (`clave`), `cobro-<pedido_id>`; the gateway's idempotency key.
    #[serde(rename = "clave")]
    pub key: String,
    /// What to charge, in cents (`importe_centimos`), above 0.
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
    /// The card token (`tarjeta`).
    #[serde(rename = "tarjeta")]
    pub card: String,
}

impl Event for Charge {
    const TIPO: &'static str = "pagos.cobrar";
    const VERSION: u32 = 1;
}

/// `pagos.reembolsar`: give an order's charge back (the saga's compensation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Refund {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The compensation's key (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
}

impl Event for Refund {
    const TIPO: &'static str = "pagos.reembolsar";
    const VERSION: u32 = 1;
}

/// `pago.confirmado`: the gateway approved the charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentConfirmed {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// What was charged, in cents (`importe_centimos`).
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
    /// The charge's key (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// The gateway's charge id (`ref_pasarela`).
    #[serde(rename = "ref_pasarela")]
    pub gateway_ref: String,
}

impl Event for PaymentConfirmed {
    const TIPO: &'static str = "pago.confirmado";
    const VERSION: u32 = 1;
}

/// `pago.rechazado`: the charge was declined, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentDeclined {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// What was asked, in cents (`importe_centimos`).
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
    /// The charge's key (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// Why (`motivo`), e.g. `tarjeta_rechazada`.
    #[serde(rename = "motivo")]
    pub reason: String,
}

impl Event for PaymentDeclined {
    const TIPO: &'static str = "pago.rechazado";
    const VERSION: u32 = 1;
}

/// `pago.reembolsado`: the charge was given back (0 cents when there was none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentRefunded {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The compensation's key (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// What was given back, in cents (`importe_centimos`).
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
}

impl Event for PaymentRefunded {
    const TIPO: &'static str = "pago.reembolsado";
    const VERSION: u32 = 1;
}

/// The request on `pagos.autorizaciones` (a bare JSON body, no envelope).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuthorisationRequest {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The amount to authorise, in cents (`importe_centimos`), at least 1.
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
}

impl Event for AuthorisationRequest {
    const TIPO: &'static str = "pagos.autorizaciones.peticion";
    const VERSION: u32 = 1;
}

/// The reply on `pagos.autorizaciones`: granted with an id, or refused with a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuthorisationReply {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// Whether it was granted (`autorizado`).
    #[serde(rename = "autorizado")]
    pub granted: bool,
    /// The authorisation's id when granted (`id_autorizacion`).
    #[serde(
        rename = "id_autorizacion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub authorisation_id: Option<String>,
    /// Why, when refused (`motivo`).
    #[serde(rename = "motivo", default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Event for AuthorisationReply {
    const TIPO: &'static str = "pagos.autorizaciones.respuesta";
    const VERSION: u32 = 1;
}
