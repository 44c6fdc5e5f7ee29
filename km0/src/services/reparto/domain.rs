//! Deliveries as reparto reads them from order events, and why one can be refused for good.
//!
//! reparto reads `pedido.pagado` at version 2, whose `datos` carry the delivery address:
//! `{"pedido_id": "P-1", "direccion_entrega": {"ciudad": "Tarragona", "calle": "Rambla Nova 1"}}`.
//! Version 1 had no address (the seed's exercise 3: `KeyError: 'direccion_entrega'`): reading
//! one is a contract failure, refused with a `esquema:` reason so an operator can fix the
//! consumer or the producer and replay it.

use entrega_core::Envelope;
use serde_json::Value;

/// The version of `pedido.pagado` reparto understands: its contract's.
pub const PAID_VERSION: u32 = <crate::contracts::orders::OrderPaid as entrega::Event>::VERSION;

/// A paid order to deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaidOrder {
    /// Order id (`pedido_id`).
    pub order_id: String,
    /// Delivery city (`direccion_entrega.ciudad`).
    pub city: String,
    /// Delivery street (`direccion_entrega.calle`).
    pub street: String,
}

/// Why a delivery can never be made from this event (permanent: dead letter at once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The event does not follow the schema reparto reads.
    #[error("esquema: {0}")]
    Schema(String),
    /// Kilómetro Cero does not deliver in that city.
    #[error("ciudad_no_cubierta: {0}")]
    CityNotServed(String),
}

fn text<'a>(map: &'a Value, field: &str, path: &str) -> Result<&'a str, DeliveryError> {
    match map.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
        Some(_) => Err(DeliveryError::Schema(format!(
            "`{path}{field}` must be a non-empty string"
        ))),
        None => Err(DeliveryError::Schema(format!("missing `{path}{field}`"))),
    }
}

impl PaidOrder {
    /// Reads a `pedido.pagado` envelope at version [`PAID_VERSION`].
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, DeliveryError> {
        if envelope.version != PAID_VERSION {
            return Err(DeliveryError::Schema(format!(
                "pedido.pagado version {} (reparto reads version {PAID_VERSION}, which carries \
                 direccion_entrega)",
                envelope.version
            )));
        }
        let data = &envelope.data;
        let order_id = text(data, "pedido_id", "")?;
        let address = data
            .get("direccion_entrega")
            .ok_or_else(|| DeliveryError::Schema("missing `direccion_entrega`".to_owned()))?;
        Ok(Self {
            order_id: order_id.to_owned(),
            city: text(address, "ciudad", "direccion_entrega.")?
                .trim()
                .to_owned(),
            street: text(address, "calle", "direccion_entrega.")?.to_owned(),
        })
    }
}

/// The order id of a `pedido.cancelado` (any version: `datos.pedido_id`, or `datos.id` as in
/// the order's own payload).
pub fn cancelled_order_id(envelope: &Envelope) -> Result<String, DeliveryError> {
    let data = &envelope.data;
    text(data, "pedido_id", "")
        .or_else(|_| text(data, "id", ""))
        .map(str::to_owned)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn paid(version: u32, data: Value) -> Envelope {
        let mut e = Envelope::new("pedido.pagado", "pagos", data);
        e.version = version;
        e
    }

    #[test]
    fn reads_version_two() {
        let e = paid(
            2,
            json!({"pedido_id": "P-1", "direccion_entrega": {"ciudad": " Tarragona ", "calle": "Rambla Nova 1"}}),
        );
        assert_eq!(
            PaidOrder::from_envelope(&e),
            Ok(PaidOrder {
                order_id: "P-1".into(),
                city: "Tarragona".into(),
                street: "Rambla Nova 1".into()
            })
        );
    }

    #[test]
    fn version_one_and_missing_fields_are_schema_errors() {
        let v1 = paid(1, json!({"pedido_id": "P-1"}));
        let err = PaidOrder::from_envelope(&v1).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("esquema: pedido.pagado version 1"),
            "{err}"
        );
        let no_city = paid(
            2,
            json!({"pedido_id": "P-1", "direccion_entrega": {"calle": "x"}}),
        );
        assert_eq!(
            PaidOrder::from_envelope(&no_city).unwrap_err().to_string(),
            "esquema: missing `direccion_entrega.ciudad`"
        );
        let bad_id = paid(2, json!({"pedido_id": 7, "direccion_entrega": {}}));
        assert!(matches!(
            PaidOrder::from_envelope(&bad_id),
            Err(DeliveryError::Schema(m)) if m.contains("pedido_id")
        ));
    }

    #[test]
    fn cancellations_name_their_order() {
        let e = Envelope::new("pedido.cancelado", "pedidos", json!({"pedido_id": "P-2"}));
        assert_eq!(cancelled_order_id(&e).unwrap(), "P-2");
        let e = Envelope::new("pedido.cancelado", "pedidos", json!({"id": "P-3"}));
        assert_eq!(cancelled_order_id(&e).unwrap(), "P-3");
        let e = Envelope::new("pedido.cancelado", "pedidos", json!({}));
        assert!(cancelled_order_id(&e).is_err());
    }
}
