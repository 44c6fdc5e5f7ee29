//! Reading an event at the version a consumer is written for: older versions are brought up
//! one step at a time by registered upcasters (v1 → v2 → v3), newer ones are refused, and
//! `datos` is then read into the consumer's type, naming the member that does not fit.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use entrega_core::Envelope;
use serde_json::Value;

use crate::{ContractError, Event, View};

type Step = Arc<dyn Fn(Value) -> Result<Value, String> + Send + Sync>;

/// The registered steps from one version of a `tipo` to the next.
#[derive(Clone, Default)]
pub struct Upcasters {
    steps: HashMap<(String, u32), Step>,
}

impl fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut steps: Vec<_> = self.steps.keys().collect();
        steps.sort();
        f.debug_struct("Upcasters").field("steps", &steps).finish()
    }
}

impl Upcasters {
    /// No steps: every consumer reads its own version only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers how `datos` of `tipo` at version `from` becomes version `from + 1`. The
    /// step may refuse (an event the new version cannot express) with a reason; the event
    /// is then a dead letter of class `esquema`.
    pub fn step(
        mut self,
        tipo: impl Into<String>,
        from: u32,
        step: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.steps.insert((tipo.into(), from), Arc::new(step));
        self
    }

    /// Whether a step from `from` to `from + 1` is registered for `tipo`.
    pub fn has_step(&self, tipo: &str, from: u32) -> bool {
        self.steps.contains_key(&(tipo.to_owned(), from))
    }

    /// The versions of `tipo` that can be read at version `to`: `to` and every older one
    /// with an unbroken chain of steps up to it, newest first.
    pub fn readable(&self, tipo: &str, to: u32) -> Vec<u32> {
        let mut versions = vec![to];
        let mut from = to;
        while from > 1 && self.has_step(tipo, from - 1) {
            from -= 1;
            versions.push(from);
        }
        versions
    }

    /// `datos` of `tipo` at `version`, brought up to version `to`.
    pub fn upcast(
        &self,
        tipo: &str,
        version: u32,
        to: u32,
        mut datos: Value,
    ) -> Result<Value, ContractError> {
        if version > to {
            return Err(ContractError::Newer {
                tipo: tipo.to_owned(),
                version,
                understood: to,
            });
        }
        if let Some(missing) = (version..to).find(|v| !self.has_step(tipo, *v)) {
            return Err(ContractError::NoPath {
                tipo: tipo.to_owned(),
                version,
                understood: to,
                missing,
            });
        }
        for from in version..to {
            if let Some(step) = self.steps.get(&(tipo.to_owned(), from)) {
                datos = step(datos).map_err(|reason| ContractError::Upcast {
                    tipo: tipo.to_owned(),
                    from,
                    reason,
                })?;
            }
        }
        Ok(datos)
    }

    /// The envelope's `datos` as `V`: read as it is when its version is one `V` reads,
    /// else upcast to the newest of them when steps allow it. Members `V` does not know are
    /// ignored. Any [`Event`](crate::Event) is a view of its own version.
    pub fn decode<V: View>(&self, envelope: &Envelope) -> Result<V, ContractError> {
        if envelope.kind != V::TIPO {
            return Err(ContractError::WrongType {
                expected: V::TIPO.to_owned(),
                got: envelope.kind.clone(),
            });
        }
        if V::VERSIONS.contains(&envelope.version) {
            // Read in place: the common case copies nothing.
            return read_at::<V, _>(envelope.version, &envelope.data);
        }
        let newest = V::VERSIONS.iter().copied().max().unwrap_or(1);
        let datos = self.upcast(V::TIPO, envelope.version, newest, envelope.data.clone())?;
        read_at::<V, _>(newest, datos)
    }
}

impl Upcasters {
    /// [`Upcasters::decode`] of a delivered event whose [`VERSIONS`](crate::transition::VERSIONS)
    /// header is `versions`: `None` for a copy this consumer leaves to another copy of the same
    /// event (published at several versions during a transition), to acknowledge without
    /// effect.
    pub fn decode_copy<V: View>(
        &self,
        envelope: &Envelope,
        versions: Option<&str>,
    ) -> Result<Option<V>, ContractError> {
        let listed = crate::transition::listed_versions(versions);
        if listed.len() > 1 {
            if let Some(chosen) = crate::transition::chosen_version::<V>(self, &listed) {
                if chosen != envelope.version {
                    return Ok(None);
                }
            }
        }
        self.decode(envelope).map(Some)
    }
}

/// `datos` (already at `E`'s version) as `E`, naming the member that does not fit.
pub fn read<E: Event>(datos: Value) -> Result<E, ContractError> {
    read_at::<E, _>(E::VERSION, datos)
}

/// `datos` (a `Value`, owned or borrowed) of `V::TIPO` at `version` as `V`, naming the
/// member that does not fit.
fn read_at<'de, V: View, D>(version: u32, datos: D) -> Result<V, ContractError>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(datos).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "datos".to_owned()
        } else {
            path
        };
        ContractError::Invalid {
            tipo: V::TIPO.to_owned(),
            version,
            field,
            reason: e.into_inner().to_string(),
        }
    })
}
