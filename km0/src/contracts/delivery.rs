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
