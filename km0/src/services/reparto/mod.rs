//! `reparto`: assigns a courier to each paid order, and shows every kind of consumer failure
//! of the seed's exercise 3 with the retry and dead-letter machinery of entrega. For the
//! order saga it takes the assignment as a command and answers it (`reparto.asignado`,
//! `reparto.rechazado`).

mod commands;
mod component;
mod coverage;
mod db;
mod domain;
mod maps;
mod messaging;

pub use commands::{
    assigned_event, refused_event, AssignCommand, CommandConsumer, ASSIGN, ASSIGNED,
    COMMANDS_CONSUMER, COMMANDS_GROUP, COMMANDS_TOPIC, DELIVERY_AGGREGATE, EVENTS_TOPIC, REFUSED,
};
pub use component::{Reparto, ASSIGN_EVERY, COMPONENT, DATABASE};
pub use coverage::{CoverageAnswers, COVERAGE};
pub use db::{Delivery, DeliveryState, DeliveryStore, UnknownState};
pub use domain::{cancelled_order_id, DeliveryError, PaidOrder, PAID_VERSION};
pub use maps::{HttpMaps, LocalMaps, Maps, MapsError};
pub use messaging::{DeliveryConsumer, DeliveryStats, CONSUMER, GROUP, TOPIC};
