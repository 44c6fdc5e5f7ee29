//! Publishing both versions during a transition (the seed's other option: "el productor
//! puede publicar ambas versiones"), configured per event type.
//!
//! The producer writes one outbox row at the new version. Its relay publishes it as the older
//! version first, then as the new one: two records, one after the other on the same key,
//! with the **same `id_evento`** (one fact, written twice), each listing the versions
//! published in the header [`VERSIONS`]. An idempotent consumer that reads any version (the
//! seed's, keyed by `id_evento`) applies the first copy and skips the second as a duplicate;
//! an entrega consumer reads the newest listed version it can read and acknowledges the
//! other copy without effect ([`chosen_version`]), so a consumer written for the new version
//! only never dead-letters the old copy.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::{Upcasters, View};

/// The header listing every version an event was published as, oldest first (`1,2`).
pub const VERSIONS: &str = "entrega-versions";

type Down = Arc<dyn Fn(Value) -> Result<Value, String> + Send + Sync>;

/// For each `tipo` published twice: the version written, the older one also published and
/// how `datos` becomes it.
#[derive(Clone, Default)]
pub struct Transitions {
    down: HashMap<(String, u32), (u32, Down)>,
}

impl fmt::Debug for Transitions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut pairs: Vec<_> = self
            .down
            .iter()
            .map(|((tipo, from), (to, _))| format!("{tipo} v{from} also as v{to}"))
            .collect();
        pairs.sort();
        f.debug_struct("Transitions").field("also", &pairs).finish()
    }
}

impl Transitions {
    /// No event published twice.
    pub fn new() -> Self {
        Self::default()
    }

    /// Publishes `tipo` written at version `from` also as version `to` (older), its `datos`
    /// made by `down`. When `down` refuses an event (the older version cannot express it),
    /// that event goes out at `from` only.
    pub fn publish_also(
        mut self,
        tipo: impl Into<String>,
        from: u32,
        to: u32,
        down: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.down.insert((tipo.into(), from), (to, Arc::new(down)));
        self
    }

    /// Whether any event is published twice.
    pub fn is_empty(&self) -> bool {
        self.down.is_empty()
    }

    /// The older copy of an event of `tipo` written at `version`: its version and `datos`,
    /// when a transition is configured and the older version can express it.
    pub fn older_copy(&self, tipo: &str, version: u32, datos: &Value) -> Option<(u32, Value)> {
        let (to, down) = self.down.get(&(tipo.to_owned(), version))?;
        down(datos.clone()).ok().map(|older| (*to, older))
    }
}

/// The versions a [`VERSIONS`] header lists; empty when it is absent or unreadable.
pub fn listed_versions(header: Option<&str>) -> Vec<u32> {
    header
        .map(|h| h.split(',').filter_map(|v| v.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Of the versions an event was published as, the one a consumer reading `V` handles: the
/// newest it reads as it is, else the newest it can upcast to one it reads. `None` when it
/// reads none of them (each copy is then handled, and fails, on its own).
pub fn chosen_version<V: View>(upcasters: &Upcasters, listed: &[u32]) -> Option<u32> {
    let newest = V::VERSIONS.iter().copied().max()?;
    let direct = listed
        .iter()
        .copied()
        .filter(|v| V::VERSIONS.contains(v))
        .max();
    direct.or_else(|| {
        let readable = upcasters.readable(V::TIPO, newest);
        listed
            .iter()
            .copied()
            .filter(|v| readable.contains(v))
            .max()
    })
}
