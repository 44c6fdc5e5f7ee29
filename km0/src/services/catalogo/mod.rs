//! `catalogo`: the catalogue's low-stock flag, kept from inventario's `stock.actualizado`
//! (the seed's exercise 2). Setting the flag from `despues` is idempotent by nature, as the
//! seed notes: a redelivered event sets the same value again, so it needs no key table.

mod component;
mod db;
mod domain;
mod messaging;

pub use component::{Catalogo, COMPONENT, DATABASE};
pub use db::{CatalogEntry, CatalogStore};
pub use domain::{StockChange, LOW_STOCK};
pub use messaging::{CatalogConsumer, GROUP, TOPIC};
