//! Event contracts for entrega.
//!
//! An event is a contract with every present and future consumer. Here it is a Rust type
//! that knows its `tipo` and `version` ([`Event`]); its JSON Schema is generated from the type
//! with a closed content model ([`schema_of`]); schemas of one version evolve under a
//! compatibility policy with the Confluent Schema Registry's semantics ([`compat`]); older
//! versions reach a consumer through registered upcasters ([`Upcasters`]); a [`Catalog`]
//! holds a system's contracts for producers to validate against and for descriptions to be
//! generated from. Whatever fails a contract is a [`ContractError`]: permanent, and dead-lettered
//! with class `esquema`.

pub mod asyncapi;
pub mod catalog;
pub mod compat;
pub mod directory;
mod event;
pub mod transition;
mod upcast;
mod validate;
mod yaml;

pub use catalog::{Catalog, Contract};
pub use compat::Compatibility;
pub use directory::{ContractFile, Directory, Finding};
pub use entrega_core::ContractError;
pub use event::{schema_of, Event, View};
pub use transition::Transitions;
pub use upcast::{read, Upcasters};
pub use validate::first_failure_in;
pub use yaml::to_yaml;

pub use schemars;
