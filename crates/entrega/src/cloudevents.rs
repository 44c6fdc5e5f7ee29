//! CloudEvents 1.0, binary content mode: the relay adds the envelope's attributes as the
//! transport's CloudEvents headers, and the payload stays the seed's envelope, byte for byte
//! (a consumer that knows nothing of CloudEvents reads what it always read).
//!
//! | CloudEvents   | from the envelope                          |
//! |---------------|--------------------------------------------|
//! | `id`          | `id_evento`                                |
//! | `type`        | `tipo`                                     |
//! | `source`      | `origen` (a URI reference)                 |
//! | `time`        | `fecha_ms`, as RFC 3339 in UTC             |
//! | `dataschema`  | `<schema base><tipo>:v<version>`           |
//! | `specversion` | `1.0`                                      |
//!
//! Kafka's binding names them `ce_<attribute>` with the data's type in `content-type`; the
//! AMQP binding `cloudEvents:<attribute>`, the data's type being the message's content type.
//! Off unless a relay is given a binding ([`crate::RelayConfig::cloudevents`]).

use entrega_core::{utc::format_utc_ms, Headers};

/// The schema base when none is given: `dataschema` is then
/// `urn:entrega:schema:<tipo>:v<version>`.
pub const DEFAULT_SCHEMA_BASE: &str = "urn:entrega:schema:";

/// How a relay writes the CloudEvents attributes of what it publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    prefix: &'static str,
    content_type: bool,
    schema_base: String,
}

impl CloudEvents {
    /// Kafka's protocol binding: `ce_` headers and `content-type`.
    pub fn kafka() -> Self {
        Self {
            prefix: "ce_",
            content_type: true,
            schema_base: DEFAULT_SCHEMA_BASE.to_owned(),
        }
    }

    /// The AMQP protocol binding: `cloudEvents:` application properties.
    pub fn amqp() -> Self {
        Self {
            prefix: "cloudEvents:",
            content_type: false,
            schema_base: DEFAULT_SCHEMA_BASE.to_owned(),
        }
    }

    /// `dataschema` as `<base><tipo>:v<version>` (an absolute URI: a URN, or a URL under which
    /// the contracts are published).
    pub fn with_schema_base(mut self, base: impl Into<String>) -> Self {
        self.schema_base = base.into();
        self
    }

    /// The attribute `name`'s header.
    pub fn header(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// `headers` with the attributes of the event `id_evento` of `tipo` at `version`, from
    /// `source`, written at `fecha_ms`.
    pub fn apply(
        &self,
        headers: Headers,
        (id_evento, tipo, version): (&str, &str, u32),
        source: &str,
        fecha_ms: i64,
    ) -> Headers {
        let headers = headers
            .with(self.header("specversion"), "1.0")
            .with(self.header("id"), id_evento)
            .with(self.header("type"), tipo)
            .with(self.header("source"), source)
            .with(self.header("time"), format_utc_ms(fecha_ms))
            .with(
                self.header("dataschema"),
                format!("{}{tipo}:v{version}", self.schema_base),
            );
        if self.content_type {
            headers.with("content-type", "application/json")
        } else {
            headers
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_becomes_the_bindings_attributes() {
        let h = CloudEvents::kafka().apply(
            Headers::new(),
            ("6f1c9e2a-0000-4000-8000-000000000001", "pedido.creado", 2),
            "pedidos",
            1_789_000_000_000,
        );
        assert_eq!(h.get("ce_specversion"), Some("1.0"));
        assert_eq!(h.get("ce_type"), Some("pedido.creado"));
        assert_eq!(h.get("ce_time"), Some("2026-09-10T00:26:40.000Z"));
        assert_eq!(
            h.get("ce_dataschema"),
            Some("urn:entrega:schema:pedido.creado:v2")
        );
        assert_eq!(h.get("content-type"), Some("application/json"));
        let h = CloudEvents::amqp().apply(Headers::new(), ("i", "t", 1), "s", 0);
        assert_eq!(h.get("cloudEvents:id"), Some("i"));
        assert_eq!(h.get("content-type"), None);
    }
}
