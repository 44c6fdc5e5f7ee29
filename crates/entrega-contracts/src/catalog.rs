//! Every contract of a system in one place: each (`tipo`, `version`) with its schema and the
//! channel (topic or queue) it travels on, each channel with its compatibility policy. What
//! producers validate against, what `contracts/` is written from, what descriptions for other
//! teams (AsyncAPI) are generated from.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::compat::Compatibility;
use crate::{schema_of, validate, ContractError, Event};

/// One contract: a version of an event type on a channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Contract {
    /// The event type (`tipo`).
    pub tipo: String,
    /// The version of `datos`.
    pub version: u32,
    /// The channel it travels on: a topic or a queue.
    pub channel: String,
    /// What it is, for a person (AsyncAPI's summary).
    pub summary: String,
    /// The JSON Schema of `datos`.
    pub schema: Value,
}

/// The contracts of a system, by `tipo` and version.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    contracts: BTreeMap<(String, u32), Contract>,
    policies: BTreeMap<String, Compatibility>,
}

impl Catalog {
    /// No contracts yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `E` on `channel`, described by `summary`.
    pub fn event<E: Event>(self, channel: &str, summary: &str) -> Self {
        self.schema(E::TIPO, E::VERSION, channel, summary, schema_of::<E>())
    }

    /// Registers a schema written by hand (or read from a registry).
    pub fn schema(
        mut self,
        tipo: &str,
        version: u32,
        channel: &str,
        summary: &str,
        schema: Value,
    ) -> Self {
        let contract = Contract {
            tipo: tipo.to_owned(),
            version,
            channel: channel.to_owned(),
            summary: summary.to_owned(),
            schema,
        };
        self.contracts.insert((tipo.to_owned(), version), contract);
        self
    }

    /// Sets `channel`'s compatibility policy (the default is
    /// [`Compatibility::BackwardTransitive`]).
    pub fn policy(mut self, channel: &str, policy: Compatibility) -> Self {
        self.policies.insert(channel.to_owned(), policy);
        self
    }

    /// The policy of `channel`.
    pub fn policy_of(&self, channel: &str) -> Compatibility {
        self.policies.get(channel).copied().unwrap_or_default()
    }

    /// Every contract, by `tipo` then version.
    pub fn contracts(&self) -> impl Iterator<Item = &Contract> {
        self.contracts.values()
    }

    /// The contract of `tipo` at `version`.
    pub fn get(&self, tipo: &str, version: u32) -> Option<&Contract> {
        self.contracts.get(&(tipo.to_owned(), version))
    }

    /// Whether any version of `tipo` is registered.
    pub fn knows(&self, tipo: &str) -> bool {
        self.contracts.keys().any(|(t, _)| t == tipo)
    }

    /// Checks `datos` of `tipo` at `version` against its contract: an unregistered
    /// version of a known `tipo` is refused, an unknown `tipo` passes (the catalog does not
    /// speak for it).
    pub fn validate(&self, tipo: &str, version: u32, datos: &Value) -> Result<(), ContractError> {
        let Some(contract) = self.get(tipo, version) else {
            if self.knows(tipo) {
                return Err(ContractError::Unregistered {
                    tipo: tipo.to_owned(),
                    version,
                });
            }
            return Ok(());
        };
        match validate::first_failure(&contract.schema, datos) {
            None => Ok(()),
            Some((field, reason)) => Err(ContractError::Invalid {
                tipo: tipo.to_owned(),
                version,
                field: if field.is_empty() {
                    "datos".to_owned()
                } else {
                    field
                },
                reason,
            }),
        }
    }
}
