//! Message headers and the header names that are part of the wire contract.

use serde::{Deserialize, Serialize};

/// Event type (`tipo`), set on every published event.
pub const TIPO: &str = "tipo";
/// Event id (`id_evento`), set on every published event.
pub const ID_EVENTO: &str = "id_evento";
/// Delivery attempts made so far (`intentos`), on retry and dead-letter messages.
pub const INTENTOS: &str = "intentos";
/// Earliest time of the next attempt, epoch seconds as float text (`no_antes`).
pub const NO_ANTES: &str = "no_antes";
/// Last error seen (`ultimo_error`), on retry messages.
pub const ULTIMO_ERROR: &str = "ultimo_error";
/// Why a message was dead-lettered (`motivo`).
pub const MOTIVO: &str = "motivo";
/// The kind of failure that dead-lettered a message (`entrega-clase`, a
/// [`crate::DeadClass`] name).
pub const CLASE: &str = "entrega-clase";
/// The handler's short code for why it refused a message (`entrega-codigo`), when it gave one.
pub const CODIGO: &str = "entrega-codigo";
/// Topic a dead letter came from.
pub const ORIGIN_TOPIC: &str = "entrega-origin-topic";
/// Partition a dead letter came from.
pub const ORIGIN_PARTITION: &str = "entrega-origin-partition";
/// Offset a dead letter came from.
pub const ORIGIN_OFFSET: &str = "entrega-origin-offset";
/// Consumer group that dead-lettered the message.
pub const ORIGIN_GROUP: &str = "entrega-origin-group";
/// Times an operator has replayed the message from a dead-letter topic (`entrega-reenvios`,
/// decimal text); absent on a message never replayed.
pub const REENVIOS: &str = "entrega-reenvios";
/// The one consumer group a replayed message is meant for (`entrega-solo-grupo`): workers of
/// every other group acknowledge it without handling it, provided it carries a valid
/// [`SOLO_GRUPO_FIRMA`] (see [`crate::ReplayKey`]); without one it is an ordinary record.
pub const SOLO_GRUPO: &str = "entrega-solo-grupo";
/// The signature of [`SOLO_GRUPO`] (`entrega-solo-grupo-firma`): HMAC-SHA256, in lowercase
/// hex, of the group, the key and the payload, under the operators' replay key.
pub const SOLO_GRUPO_FIRMA: &str = "entrega-solo-grupo-firma";

/// Ordered list of text headers. Names may repeat; [`Headers::get`] returns the last value,
/// which is how Kafka clients conventionally read a header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// An empty header list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a header, keeping earlier ones.
    pub fn push(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.push((name.into(), value.into()));
    }

    /// Sets a header, replacing every earlier value of that name.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = name.into();
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value.into()));
    }

    /// Removes every value of a header.
    pub fn remove(&mut self, name: &str) {
        self.0.retain(|(n, _)| n != name);
    }

    /// Builder form of [`Headers::set`].
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.set(name, value);
        self
    }

    /// The last value of a header, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Iterates the headers in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Encodes the headers as a JSON array of `[name, value]` pairs (for database storage).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_else(|_| "[]".to_owned())
    }

    /// Decodes headers stored by [`Headers::to_json`].
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text).map(Self)
    }

    /// Encodes the headers as a JSON object of text values, the last value of a repeated
    /// name winning (the outbox's `cabeceras`); `None` when there are none.
    pub fn to_json_object(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let object: serde_json::Map<String, serde_json::Value> = self
            .0
            .iter()
            .map(|(n, v)| (n.clone(), serde_json::Value::String(v.clone())))
            .collect();
        Some(serde_json::Value::Object(object).to_string())
    }

    /// Decodes a JSON object of text values, as [`Headers::to_json_object`] writes it. The
    /// column may have been written by other code: entries whose value is not text are
    /// skipped, and anything but an object reads as no headers.
    pub fn from_json_object(text: &str) -> Self {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(object)) => object
                .into_iter()
                .filter_map(|(n, v)| match v {
                    serde_json::Value::String(v) => Some((n, v)),
                    _ => None,
                })
                .collect(),
            _ => Self::new(),
        }
    }
}

impl FromIterator<(String, String)> for Headers {
    fn from_iter<T: IntoIterator<Item = (String, String)>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}
