//! `pedidos.eventos`: the life of an order, keyed by its id (`agregado` `pedido`).

use entrega::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Line {
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

/// Where an order is delivered, as km0's first version carries it (`direccion_entrega`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreetAddress {
    /// City (`ciudad`).
    #[serde(rename = "ciudad")]
    pub city: String,
    /// Street and number (`calle`).
    #[serde(rename = "calle")]
    pub street: String,
}

/// `pedido.creado` version 1: the order as the client sent it (the seed's
/// `json.dumps(pedido)`), with what km0 adds when it runs the order saga.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCreated {
    /// Order id chosen by the client (`id`).
    pub id: String,
    /// Customer (`cliente`).
    #[serde(rename = "cliente")]
    pub customer: String,
    /// Market the order is for (`mercado`).
    #[serde(rename = "mercado")]
    pub market: String,
    /// Lines (`lineas`).
    #[serde(rename = "lineas")]
    pub lines: Vec<Line>,
    /// Card token to charge (`tarjeta`), when the client gave one.
    #[serde(rename = "tarjeta", default, skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    /// Delivery address (`direccion_entrega`), when the client gave one.
    #[serde(
        rename = "direccion_entrega",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub address: Option<StreetAddress>,
    /// Under the saga: the key of the saga's stock reservation (`reserva`); inventario then
    /// leaves the stock to the saga's command.
    #[serde(rename = "reserva", default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Under the saga: the key of the saga's charge (`cobro`); pagos then leaves the charge
    /// to the saga's command.
    #[serde(rename = "cobro", default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
}

impl Event for OrderCreated {
    const TIPO: &'static str = "pedido.creado";
    const VERSION: u32 = 1;
}

/// `pedido.pagado` version 2: the saga's order, paid, with where it goes and who takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrderPaid {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// What was charged, in cents (`importe_centimos`).
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
    /// Where it is delivered (`direccion_entrega`).
    #[serde(rename = "direccion_entrega")]
    pub address: StreetAddress,
    /// The courier assigned (`repartidor_id`).
    #[serde(rename = "repartidor_id")]
    pub courier_id: String,
}

impl Event for OrderPaid {
    const TIPO: &'static str = "pedido.pagado";
    const VERSION: u32 = 2;
}

/// `pedido.pagado` version 1, as the seed's pagos publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrderPaidV1 {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// What was charged, in cents (`importe`).
    #[serde(rename = "importe")]
    pub amount_cents: i64,
}

impl Event for OrderPaidV1 {
    const TIPO: &'static str = "pedido.pagado";
    const VERSION: u32 = 1;
}

/// `pedido.cancelado`: the saga gave the order up and undid its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCancelled {
    /// The order (`pedido_id`).
    #[serde(rename = "pedido_id")]
    pub order_id: String,
    /// Why (`motivo`).
    #[serde(rename = "motivo")]
    pub reason: String,
}

impl Event for OrderCancelled {
    const TIPO: &'static str = "pedido.cancelado";
    const VERSION: u32 = 1;
}
