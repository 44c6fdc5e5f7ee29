//! Reservations as the order saga asks for them: the commands inventario reads from
//! `inventario.comandos`, the answers and stock changes it writes to its outbox (routed to
//! `inventario.eventos`), and the reason every stock change carries.
//!
//! A reservation is known by its id (`reserva-<pedido>`): reserving it again answers what
//! the first reservation answered; releasing it gives its stock back once; releasing one that
//! was never made leaves a tombstone, so a reservation arriving after its release is refused
//! instead of taking stock nobody will give back.

use entrega::{ContractError, Event};
use entrega_core::{Envelope, NewEvent};

use crate::contracts::{self, stock};

use super::domain::{check_lines, StockError, StockLine};

/// The topic of inventario's commands (the order saga's reservations and releases).
pub const COMMANDS_TOPIC: &str = "inventario.comandos";
/// The topic of inventario's events: answers and `stock.actualizado`.
pub const EVENTS_TOPIC: &str = "inventario.eventos";
/// Reserve an order's stock (`inventario.reservar`).
pub const RESERVE: &str = "inventario.reservar";
/// Give a reservation's stock back (`inventario.liberar`).
pub const RELEASE: &str = "inventario.liberar";
/// The stock is reserved (`reserva.confirmada`).
pub const RESERVED: &str = "reserva.confirmada";
/// The stock could not be reserved (`reserva.rechazada`).
pub const REFUSED: &str = "reserva.rechazada";
/// The reservation was released, or there was nothing to release (`reserva.liberada`).
pub const RELEASED: &str = "reserva.liberada";
/// A product's units changed (`stock.actualizado`), the seed's exercise 2.
pub const STOCK_UPDATED: &str = "stock.actualizado";
/// Aggregate of stock changes in the outbox (`producto`, keyed by product, as the seed's
/// solution 2 has it, so one product's changes stay in order).
pub const STOCK_AGGREGATE: &str = "producto";
/// Aggregate of reservation answers in the outbox (`reserva`, keyed by order).
pub const RESERVATION_AGGREGATE: &str = "reserva";

/// Why stock moved (`motivo` of `stock.actualizado`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Motive {
    /// A `pedido.creado` took it (`pedido`, the seed's direct path).
    Order,
    /// A saga's reservation took it (`reserva`).
    Reservation,
    /// A released reservation gave it back (`liberacion`).
    Release,
    /// An operator added units (`reposicion`).
    Restock,
}

impl Motive {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Order => "pedido",
            Self::Reservation => "reserva",
            Self::Release => "liberacion",
            Self::Restock => "reposicion",
        }
    }
}

/// Where a reservation stands (`reservas.estado`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationState {
    /// Its stock is taken (`reservada`).
    Held,
    /// It could not be served; nothing was taken (`rechazada`).
    Refused,
    /// Its stock was given back, or it was released before it was made (`liberada`).
    Released,
}

impl ReservationState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "reservada",
            Self::Refused => "rechazada",
            Self::Released => "liberada",
        }
    }

    /// The state a stored name stands for.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Held, Self::Refused, Self::Released]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

/// `inventario.reservar`: `{"pedido_id", "id_reserva", "lineas": [{"producto", "cantidad"}]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveCommand {
    /// The order.
    pub order_id: String,
    /// The reservation's id, its idempotency key.
    pub reservation_id: String,
    /// What to take.
    pub lines: Vec<StockLine>,
}

/// `inventario.liberar`: `{"pedido_id", "id_reserva", "clave"}` (the key of the release,
/// answered back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseCommand {
    /// The order.
    pub order_id: String,
    /// The reservation to release.
    pub reservation_id: String,
    /// The release's own key (`liberacion-<pedido>`).
    pub key: String,
}

impl ReserveCommand {
    /// Reads the command (`inventario.reservar`).
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, StockError> {
        let command: stock::Reserve = contracts::upcasters().decode(envelope)?;
        let lines: Vec<StockLine> = command
            .lines
            .into_iter()
            .map(|u| StockLine {
                product: u.product,
                quantity: u.quantity,
            })
            .collect();
        check_lines(stock::Reserve::TIPO, envelope.version, &lines)?;
        Ok(Self {
            order_id: command.order_id,
            reservation_id: command.reservation_id,
            lines,
        })
    }

    /// The command's event (what the order saga sends).
    pub fn event(&self) -> Result<NewEvent, ContractError> {
        let lines = self
            .lines
            .iter()
            .map(|l| stock::Units {
                product: l.product.clone(),
                quantity: l.quantity,
            })
            .collect();
        stock::Reserve {
            order_id: self.order_id.clone(),
            reservation_id: self.reservation_id.clone(),
            key: self.reservation_id.clone(),
            lines,
        }
        .outgoing(RESERVATION_AGGREGATE, &self.order_id)
    }
}

impl ReleaseCommand {
    /// Reads the command (`inventario.liberar`).
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, StockError> {
        let command: stock::Release = contracts::upcasters().decode(envelope)?;
        Ok(Self {
            order_id: command.order_id,
            reservation_id: command.reservation_id,
            key: command.key,
        })
    }

    /// The command's event (what the order saga sends).
    pub fn event(&self) -> Result<NewEvent, ContractError> {
        stock::Release {
            order_id: self.order_id.clone(),
            reservation_id: self.reservation_id.clone(),
            key: self.key.clone(),
        }
        .outgoing(RESERVATION_AGGREGATE, &self.order_id)
    }
}

/// The answer to a reservation: `reserva.confirmada`, or `reserva.rechazada` with `motivo`.
pub fn reservation_answer(
    command: &ReserveCommand,
    refused: Option<&str>,
) -> Result<NewEvent, ContractError> {
    let (order_id, reservation_id) = (command.order_id.clone(), command.reservation_id.clone());
    let key = reservation_id.clone();
    match refused {
        Some(reason) => stock::ReservationRefused {
            order_id,
            reservation_id,
            key,
            reason: reason.to_owned(),
        }
        .outgoing(RESERVATION_AGGREGATE, &command.order_id),
        None => stock::Reserved {
            order_id,
            reservation_id,
            key,
        }
        .outgoing(RESERVATION_AGGREGATE, &command.order_id),
    }
}

/// The answer to a release: `reserva.liberada`, under the release's key.
pub fn release_answer(command: &ReleaseCommand) -> Result<NewEvent, ContractError> {
    stock::Released {
        order_id: command.order_id.clone(),
        reservation_id: command.reservation_id.clone(),
        key: command.key.clone(),
    }
    .outgoing(RESERVATION_AGGREGATE, &command.order_id)
}

/// `stock.actualizado` `{producto, antes, despues, motivo, pedido_id}` (the seed's solution 2);
/// `pedido_id` absent when no order moved the stock (an operator's restock).
pub fn stock_updated(
    product: &str,
    before: i64,
    after: i64,
    motive: Motive,
    order_id: Option<&str>,
) -> Result<NewEvent, ContractError> {
    stock::StockUpdated {
        product: product.to_owned(),
        before,
        after,
        motive: match motive {
            Motive::Order => stock::StockMotive::Order,
            Motive::Reservation => stock::StockMotive::Reservation,
            Motive::Release => stock::StockMotive::Release,
            Motive::Restock => stock::StockMotive::Restock,
        },
        order_id: order_id.map(str::to_owned),
    }
    .outgoing(STOCK_AGGREGATE, product)
}

/// `lines` with one entry per product, quantities summed, in first-seen order.
pub fn by_product(lines: &[StockLine]) -> Vec<StockLine> {
    let mut out: Vec<StockLine> = Vec::with_capacity(lines.len());
    for line in lines {
        match out.iter_mut().find(|l| l.product == line.product) {
            Some(l) => l.quantity = l.quantity.saturating_add(line.quantity),
            None => out.push(line.clone()),
        }
    }
    out
}
