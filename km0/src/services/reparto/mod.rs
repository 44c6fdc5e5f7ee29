//! `reparto`: assigns a courier to each paid order, and shows every kind of consumer failure
//! of the seed's exercise 3 with the retry and dead-letter machinery of entrega.

mod db;
mod domain;
mod maps;
mod messaging;

pub use db::{Delivery, DeliveryState, DeliveryStore, UnknownState};
pub use domain::{cancelled_order_id, DeliveryError, PaidOrder, PAID_VERSION};
pub use maps::{HttpMaps, LocalMaps, Maps, MapsError};
pub use messaging::{DeliveryConsumer, DeliveryStats, CONSUMER, GROUP, TOPIC};
