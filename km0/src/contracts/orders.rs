//! `pedidos.eventos`: the life of an order, keyed by its id (`agregado` `pedido`).

use entrega::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// Where an order is delivered in `pedido.creado` version 2, as the seed's envelope example
/// shows it (`direccion_entrega`: `ciudad`, `codigo_postal`), with the street km0's couriers
/// need when the client gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeliveryAddress {
    /// City (`ciudad`).
    #[serde(rename = "ciudad")]
    pub city: String,
    /// Postal code (`codigo_postal`), five digits.
    #[serde(rename = "codigo_postal")]
    #[schemars(regex(pattern = r"^[0-9]{5}$"))]
    pub postal_code: String,
    /// Street and number (`calle`).
    #[serde(rename = "calle", default, skip_serializing_if = "Option::is_none")]
    pub street: Option<String>,
}

/// `pedido.creado` version 2, the one pedidos publishes: the seed's envelope example
/// (`id`, `cliente`, `lineas` with `precio_centimos`, `direccion_entrega` with `ciudad` and
/// `codigo_postal`), with what km0 adds as optional members. Version 1's address has no
/// postal code and always a street: readers of one cannot read the other, hence the bump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCreated {
    /// Order id chosen by the client (`id`).
    pub id: String,
    /// Customer (`cliente`).
    #[serde(rename = "cliente")]
    pub customer: String,
    /// Lines (`lineas`).
    #[serde(rename = "lineas")]
    pub lines: Vec<Line>,
    /// Delivery address (`direccion_entrega`), when the client gave one.
    #[serde(
        rename = "direccion_entrega",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub address: Option<DeliveryAddress>,
    /// Market the order is for (`mercado`), when the client named one.
    #[serde(rename = "mercado", default, skip_serializing_if = "Option::is_none")]
    pub market: Option<String>,
    /// Card token to charge (`tarjeta`), when the client gave one.
    #[serde(rename = "tarjeta", default, skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
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
    const VERSION: u32 = 2;
}

/// `pedido.creado` version 1: the order as the seed's pedidos publishes it
/// (`json.dumps(pedido)`: `id`, `cliente`, `lineas`), with what km0's first version added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCreatedV1 {
    /// Order id chosen by the client (`id`).
    pub id: String,
    /// Customer (`cliente`).
    #[serde(rename = "cliente")]
    pub customer: String,
    /// Market the order is for (`mercado`); the seed's orders have none.
    #[serde(rename = "mercado", default, skip_serializing_if = "Option::is_none")]
    pub market: Option<String>,
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
    /// Under the saga: the saga's stock reservation (`reserva`).
    #[serde(rename = "reserva", default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Under the saga: the saga's charge (`cobro`).
    #[serde(rename = "cobro", default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
}

impl Event for OrderCreatedV1 {
    const TIPO: &'static str = "pedido.creado";
    const VERSION: u32 = 1;
}

/// `pedido.creado` version 2 written as version 1, for consumers that read version 1 only
/// while both are published: the address without its postal code. An address without a
/// street cannot be written as version 1, whose address requires one.
pub fn order_created_v2_to_v1(mut datos: Value) -> Result<Value, String> {
    let Some(map) = datos.as_object_mut() else {
        return Err("datos: not an object".to_owned());
    };
    if let Some(Value::Object(address)) = map.get_mut("direccion_entrega") {
        if !address.contains_key("calle") {
            return Err("direccion_entrega.calle: version 1 requires a street".to_owned());
        }
        address.remove("codigo_postal");
    }
    Ok(datos)
}

/// `pedido.creado` version 1 brought up to version 2: every member moves as it is; an
/// address, which version 1 writes without a postal code, cannot be expressed in version 2
/// (a postal code is not something to guess) and is refused, naming the member.
pub fn order_created_v1_to_v2(mut datos: Value) -> Result<Value, String> {
    let Some(map) = datos.as_object_mut() else {
        return Err("datos: not an object".to_owned());
    };
    if let Some(address) = map.get("direccion_entrega") {
        if address.is_null() {
            map.remove("direccion_entrega");
        } else {
            return Err(
                "direccion_entrega.codigo_postal: version 1 has no postal code to carry over"
                    .to_owned(),
            );
        }
    }
    Ok(datos)
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
