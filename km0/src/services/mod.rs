//! The services of Kilómetro Cero, each with the same files: `domain.rs` (rules, no I/O),
//! `db.rs` (its own database), `http.rs` (its API, if any), `messaging.rs` (its events) and
//! `component.rs` (what runs, the database and the topics and groups it owns).

pub mod analitica;
pub mod catalogo;
pub mod input;
pub mod inventario;
pub mod pagos;
pub mod pasarela;
pub mod pedidos;
pub mod reparto;

/// Every component of km0, listed once, in the order they start: `km0 run <name>`, `km0 up`,
/// `km0 migrate` (their databases), the topics created and the consumer groups' queues all
/// come from this list.
pub static COMPONENTS: &[&(dyn crate::wiring::Component + 'static)] = &[
    &pedidos::API,
    &pasarela::COMPONENT,
    &pedidos::RELAY,
    &inventario::COMPONENT,
    &catalogo::COMPONENT,
    &reparto::COMPONENT,
    &pagos::COMPONENT,
    &analitica::COMPONENT,
];
