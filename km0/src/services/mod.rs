//! The services of Kilómetro Cero, each with the same files: `domain.rs` (rules, no I/O),
//! `db.rs` (its own database), `http.rs` (its API, if any) and `messaging.rs` (its events).

pub mod analitica;
pub mod catalogo;
pub mod inventario;
pub mod pagos;
pub mod pasarela;
pub mod pedidos;
pub mod reparto;
