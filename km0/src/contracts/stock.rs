//! `inventario.comandos` (the saga's reservation and its release) and `inventario.eventos`
//! (their answers, keyed by order, and every stock change, keyed by product).

use entrega::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A product and a quantity, in a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Units {
    /// Product id (`producto`).
    #[serde(rename = "producto")]
    pub product: String,
    /// Units (`cantidad`), at least 1.
    #[serde(rename = "cantidad")]
    pub quantity: i32,
}

/// `inventario.reservar`: set these units aside for an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reserve {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The reservation's id (`id_reserva`): repeats of the command are the same reservation.
    #[serde(rename = "id_reserva")]
    pub reservation_id: String,
    /// The saga step's key (`clave`), the same as `id_reserva`.
    #[serde(rename = "clave")]
    pub key: String,
    /// What to set aside (`lineas`).
    #[serde(rename = "lineas")]
    pub lines: Vec<Units>,
}

impl Event for Reserve {
    const TIPO: &'static str = "inventario.reservar";
    const VERSION: u32 = 1;
}

/// `inventario.liberar`: give a reservation's units back (the saga's compensation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Release {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The reservation to release (`id_reserva`).
    #[serde(rename = "id_reserva")]
    pub reservation_id: String,
    /// The compensation's key (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
}

impl Event for Release {
    const TIPO: &'static str = "inventario.liberar";
    const VERSION: u32 = 1;
}

/// `reserva.confirmada`: the units are set aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reserved {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The reservation (`id_reserva`).
    #[serde(rename = "id_reserva")]
    pub reservation_id: String,
    /// The key of the command answered (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
}

impl Event for Reserved {
    const TIPO: &'static str = "reserva.confirmada";
    const VERSION: u32 = 1;
}

/// `reserva.rechazada`: nothing was set aside, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationRefused {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The reservation (`id_reserva`).
    #[serde(rename = "id_reserva")]
    pub reservation_id: String,
    /// The key of the command answered (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
    /// Why (`motivo`), e.g. `sin stock de queso-curado`.
    #[serde(rename = "motivo")]
    pub reason: String,
}

impl Event for ReservationRefused {
    const TIPO: &'static str = "reserva.rechazada";
    const VERSION: u32 = 1;
}

/// `reserva.liberada`: the reservation's units are back (or there was nothing to give back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Released {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// The reservation (`id_reserva`).
    #[serde(rename = "id_reserva")]
    pub reservation_id: String,
    /// The key of the compensation answered (`clave`).
    #[serde(rename = "clave")]
    pub key: String,
}

impl Event for Released {
    const TIPO: &'static str = "reserva.liberada";
    const VERSION: u32 = 1;
}

/// Why a product's stock changed (`motivo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StockMotive {
    /// Taken by an order applied from `pedido.creado` (`pedido`).
    #[serde(rename = "pedido")]
    Order,
    /// Taken by a saga's reservation (`reserva`).
    #[serde(rename = "reserva")]
    Reservation,
    /// Given back by a release (`liberacion`).
    #[serde(rename = "liberacion")]
    Release,
    /// Added by an operator (`reposicion`): no order moved it.
    #[serde(rename = "reposicion")]
    Restock,
}

/// `stock.actualizado`: a product's units changed (keyed by product, `agregado` `producto`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StockUpdated {
    /// The product (`producto`).
    #[serde(rename = "producto")]
    pub product: String,
    /// Units before the change (`antes`).
    #[serde(rename = "antes")]
    pub before: i64,
    /// Units after it (`despues`).
    #[serde(rename = "despues")]
    pub after: i64,
    /// Why (`motivo`).
    #[serde(rename = "motivo")]
    pub motive: StockMotive,
    /// The order that moved it (`pedido_id`); absent when no order did (a restock).
    #[serde(rename = "pedido_id", default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
}

impl Event for StockUpdated {
    const TIPO: &'static str = "stock.actualizado";
    const VERSION: u32 = 1;
}
