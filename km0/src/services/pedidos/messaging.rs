//! The events `pedidos` publishes, with the seed's names.

use entrega::TopicRouting;
use entrega::{ContractError, Event};
use entrega_core::NewEvent;

use crate::contracts::orders::{DeliveryAddress, Line, OrderCreated};

use super::domain::NewOrder;

/// Topic of every order event (`pedidos.eventos`), keyed by order id.
pub const TOPIC: &str = "pedidos.eventos";
/// Partitions of [`TOPIC`] when km0 creates it (six, as in the seed's diagram).
pub const PARTITIONS: u32 = 6;
/// Aggregate type of order events in the outbox (`agregado`).
pub const AGGREGATE: &str = "pedido";
/// The producing service (`origen` of the envelope).
pub const SOURCE: &str = "pedidos";
/// An order was created (`pedido.creado`).
pub const ORDER_CREATED: &str = "pedido.creado";
/// An order was paid (`pedido.pagado`).
pub const ORDER_PAID: &str = "pedido.pagado";
/// An order was cancelled (`pedido.cancelado`).
pub const ORDER_CANCELLED: &str = "pedido.cancelado";

/// Where the relay of pedidos publishes: orders to [`TOPIC`]; the order saga's commands to
/// their services' command topics; events of any other aggregate `x` that shares the outbox
/// to `xs.eventos` (the seed's naming).
pub fn routing() -> TopicRouting {
    use crate::services::{inventario, pagos, reparto};
    TopicRouting::new()
        .route(AGGREGATE, TOPIC)
        .route(
            inventario::RESERVATION_AGGREGATE,
            inventario::COMMANDS_TOPIC,
        )
        .route(pagos::COMMAND_AGGREGATE, pagos::COMMANDS_TOPIC)
        .route(reparto::DELIVERY_AGGREGATE, reparto::COMMANDS_TOPIC)
        .otherwise("{aggregate}s.eventos")
}

/// The `pedido.creado` of an order the saga runs: the order as received, plus the keys under
/// which the saga asks for its stock (`reserva`) and its charge (`cobro`), so inventario and
/// pagos leave those to the saga's commands instead of acting on the event.
pub fn order_created_in_saga(order: &NewOrder) -> Result<NewEvent, ContractError> {
    OrderCreated {
        reservation: Some(format!("reserva-{}", order.id)),
        charge: Some(format!("cobro-{}", order.id)),
        ..created(order)
    }
    .outgoing(AGGREGATE, &order.id)
}

/// The `pedido.creado` event of a new order: aggregate `pedido`, aggregate id the order id,
/// payload the order as received (the seed's `json.dumps(pedido)`).
pub fn order_created(order: &NewOrder) -> Result<NewEvent, ContractError> {
    created(order).outgoing(AGGREGATE, &order.id)
}

fn created(order: &NewOrder) -> OrderCreated {
    OrderCreated {
        id: order.id.clone(),
        customer: order.customer.clone(),
        market: Some(order.market.clone()),
        lines: order
            .lines
            .iter()
            .map(|l| Line {
                product: l.product.clone(),
                quantity: l.quantity,
                price_cents: l.price_cents,
            })
            .collect(),
        card: order.card.clone(),
        address: order.address.as_ref().map(|a| DeliveryAddress {
            city: a.city.clone(),
            postal_code: a.postal_code.clone(),
            street: Some(a.street.clone()),
        }),
        reservation: None,
        charge: None,
    }
}
