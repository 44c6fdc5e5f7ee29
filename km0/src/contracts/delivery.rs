//! `reparto.comandos` (the saga's courier assignment) and `reparto.eventos` (its answers).

use entrega::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::orders::StreetAddress;

/// `reparto.asignar`: find a courier for an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Assign {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The saga step's key (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// Where it goes (`direccion_entrega`).
    #[serde(rename = "direccion_entrega")]
    pub address: StreetAddress,
}

impl Event for Assign {
    const TIPO: &'static str = "reparto.asignar";
    const VERSION: u32 = 1;
}

/// `reparto.asignado`: a courier takes the order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Assigned {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The key of the command answered (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// The courier (`repartidor_id`).
    #[serde(rename = "repartidor_id")]
    pub courier_id: String,
}

impl Event for Assigned {
    const TIPO: &'static str = "reparto.asignado";
    const VERSION: u32 = 1;
}

/// `reparto.rechazado`: no courier will take it, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AssignmentRefused {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The key of the command answered (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// Why (`motivo`), e.g. `ciudad_no_cubierta: Lleida`.
    #[serde(rename = "motivo")]
    pub reason: String,
}

impl Event for AssignmentRefused {
    const TIPO: &'static str = "reparto.rechazado";
    const VERSION: u32 = 1;
}

/// The request on `reparto.cobertura`: which cities have couriers (a bare JSON object, no
/// envelope; it has no members).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CoverageRequest {}

impl Event for CoverageRequest {
    const TIPO: &'static str = "reparto.cobertura.peticion";
    const VERSION: u32 = 1;
}

/// The reply on `reparto.cobertura`: the cities km0 delivers in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CoverageReply {
    /// Every city with a courier, in order, each once (`ciudades`).
    #[serde(rename = "ciudades")]
    pub cities: Vec<String>,
}

impl Event for CoverageReply {
    const TIPO: &'static str = "reparto.cobertura.respuesta";
    const VERSION: u32 = 1;
}
