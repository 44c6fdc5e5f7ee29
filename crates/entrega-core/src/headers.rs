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
/// The kind of failure that dead-lettered a message (`entrega-class`, a
/// [`crate::DeadClass`] name).
pub const CLASS: &str = "entrega-class";
/// The handler's short code for why it refused a message (`entrega-code`), when it gave one.
pub const CODE: &str = "entrega-code";
/// Topic a dead letter came from.
pub const ORIGIN_TOPIC: &str = "entrega-origin-topic";
/// Partition a dead letter came from.
pub const ORIGIN_PARTITION: &str = "entrega-origin-partition";
/// Offset a dead letter came from.
pub const ORIGIN_OFFSET: &str = "entrega-origin-offset";
/// Consumer group that dead-lettered the message.
pub const ORIGIN_GROUP: &str = "entrega-origin-group";
/// Times an operator has replayed the message from a dead-letter topic (`entrega-replays`,
/// decimal text); absent on a message never replayed.
pub const REPLAYS: &str = "entrega-replays";
/// The one consumer group a replayed message is meant for (`entrega-only-group`): workers of
/// every other group acknowledge it without handling it, provided it carries a valid
/// [`ONLY_GROUP_SIGNATURE`] (see [`crate::ReplayKey`]); without one it is an ordinary record.
pub const ONLY_GROUP: &str = "entrega-only-group";
/// The signature of [`ONLY_GROUP`] (`entrega-only-group-signature`): HMAC-SHA256, in
/// lowercase hex, of the group, the key and the payload, under the operators' replay key.
pub const ONLY_GROUP_SIGNATURE: &str = "entrega-only-group-signature";

/// The names entrega's own headers had before they were English. Messages written by an
/// earlier release (dead letters kept for weeks, replays in flight) carry them: they are
/// read, under [`Headers::get_current`], and removed with the current name, but never
/// written. Read for one release (docs/GLOSSARY.md).
pub mod former {
    /// [`super::CLASS`] before.
    pub const CLASE: &str = "entrega-clase";
    /// [`super::CODE`] before.
    pub const CODIGO: &str = "entrega-codigo";
    /// [`super::REPLAYS`] before.
    pub const REENVIOS: &str = "entrega-reenvios";
    /// [`super::ONLY_GROUP`] before.
    pub const SOLO_GRUPO: &str = "entrega-solo-grupo";
    /// [`super::ONLY_GROUP_SIGNATURE`] before.
    pub const SOLO_GRUPO_FIRMA: &str = "entrega-solo-grupo-firma";
    /// The request/reply deadline header before (`entrega-rpc-expires-ms` now).
    pub const RPC_EXPIRA_MS: &str = "entrega-rpc-expira-ms";

    /// `(name now, name before)` of every renamed header.
    pub const RENAMED: [(&str, &str); 6] = [
        (super::CLASS, CLASE),
        (super::CODE, CODIGO),
        (super::REPLAYS, REENVIOS),
        (super::ONLY_GROUP, SOLO_GRUPO),
        (super::ONLY_GROUP_SIGNATURE, SOLO_GRUPO_FIRMA),
        ("entrega-rpc-expires-ms", RPC_EXPIRA_MS),
    ];

    /// The name `current` had before, if it was renamed.
    pub fn before(current: &str) -> Option<&'static str> {
        RENAMED
            .iter()
            .find(|(now, _)| *now == current)
            .map(|(_, then)| *then)
    }
}

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

    /// The value of `name`, or, on a message an earlier release wrote, of the name it had
    /// then ([`former`]).
    pub fn get_current(&self, name: &str) -> Option<&str> {
        self.get(name)
            .or_else(|| former::before(name).and_then(|then| self.get(then)))
    }

    /// Removes every header named `name` and every header under the name it had before
    /// ([`former`]).
    pub fn remove_current(&mut self, name: &str) {
        self.remove(name);
        if let Some(then) = former::before(name) {
            self.remove(then);
        }
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
