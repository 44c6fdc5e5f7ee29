//! Deliveries as reparto reads them from order events, and why one can be refused for good.
//!
//! reparto reads `pedido.pagado` at version 2, whose `datos` carry the delivery address:
//! `{"pedido_id": "P-1", "direccion_entrega": {"ciudad": "Tarragona", "calle": "Rambla Nova 1"}}`.
//! Version 1 had no address (the seed's exercise 3: `KeyError: 'direccion_entrega'`): reading
//! one is a contract failure, refused with a `esquema:` reason so an operator can fix the
//! consumer or the producer and replay it.

use entrega::{ContractError, HandlerError, View};
use entrega_core::Envelope;
use serde::Deserialize;

use crate::contracts;

/// The version of `pedido.pagado` reparto understands: its contract's.
pub const PAID_VERSION: u32 = <crate::contracts::orders::OrderPaid as entrega::Event>::VERSION;

/// A paid order to deliver: what reparto reads of a `pedido.pagado` version 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaidOrder {
    /// Order id (`pedido_id`).
    pub order_id: String,
    /// Delivery city (`direccion_entrega.ciudad`).
    pub city: String,
    /// Delivery street (`direccion_entrega.calle`).
    pub street: String,
}

#[derive(Debug, Deserialize)]
struct PaidView {
    pedido_id: String,
    direccion_entrega: AddressView,
}

impl View for PaidView {
    const TIPO: &'static str = crate::services::pedidos::ORDER_PAID;
    const VERSIONS: &'static [u32] = &[PAID_VERSION];
}

#[derive(Debug, Deserialize)]
struct AddressView {
    ciudad: String,
    calle: String,
}

/// Why a delivery can never be made from this event (permanent: dead letter at once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The event does not meet the contract reparto reads.
    #[error("esquema: {0}")]
    Schema(ContractError),
    /// Kilómetro Cero does not deliver in that city; `covered` are the cities it does.
    #[error("ciudad_no_cubierta: {city} (covered: {})", covered_list(.covered))]
    CityNotServed {
        /// The city asked for.
        city: String,
        /// The cities with couriers, in order.
        covered: Vec<String>,
    },
}

/// The covered cities as a refusal names them: comma-separated, `none` when there are none.
fn covered_list(covered: &[String]) -> String {
    if covered.is_empty() {
        "none".to_owned()
    } else {
        covered.join(", ")
    }
}

impl DeliveryError {
    /// The error as the worker classifies it: a contract failure is a dead letter of class
    /// `esquema`, a city not served one of class `rechazado`.
    pub fn into_handler_error(self) -> HandlerError {
        match self {
            Self::Schema(e) => HandlerError::contract(e),
            other => HandlerError::permanent(other),
        }
    }
}

/// A member present but blank, which a contract's string type lets through.
pub(super) fn blank(tipo: &str, version: u32, field: &str) -> DeliveryError {
    DeliveryError::Schema(ContractError::Invalid {
        tipo: tipo.to_owned(),
        version,
        field: field.to_owned(),
        reason: "must not be blank".to_owned(),
    })
}

impl PaidOrder {
    /// Reads a `pedido.pagado` at version [`PAID_VERSION`]; version 1 has no address and
    /// no upcaster can make one up.
    pub fn from_envelope(envelope: &Envelope) -> Result<Self, DeliveryError> {
        let view: PaidView = contracts::upcasters()
            .decode(envelope)
            .map_err(DeliveryError::Schema)?;
        let city = view.direccion_entrega.ciudad.trim().to_owned();
        let tipo = PaidView::TIPO;
        if view.pedido_id.trim().is_empty() {
            return Err(blank(tipo, envelope.version, "pedido_id"));
        }
        if city.is_empty() {
            return Err(blank(tipo, envelope.version, "direccion_entrega.ciudad"));
        }
        Ok(Self {
            order_id: view.pedido_id,
            city,
            street: view.direccion_entrega.calle,
        })
    }
}

/// What reparto reads of a `pedido.cancelado`: its order, as `pedido_id` or (as in the
/// order's own payload) `id`.
#[derive(Debug, Deserialize)]
struct CancelledView {
    #[serde(default)]
    pedido_id: Option<String>,
    #[serde(default)]
    id: Option<String>,
}

/// The order id of a `pedido.cancelado` (any version: `datos.pedido_id`, or `datos.id` as in
/// the order's own payload).
pub fn cancelled_order_id(envelope: &Envelope) -> Result<String, DeliveryError> {
    let view: CancelledView = serde_json::from_value(envelope.data.clone()).map_err(|e| {
        DeliveryError::Schema(ContractError::Invalid {
            tipo: envelope.kind.clone(),
            version: envelope.version,
            field: "datos".to_owned(),
            reason: e.to_string(),
        })
    })?;
    view.pedido_id
        .or(view.id)
        .filter(|id| !id.trim().is_empty())
        .ok_or_else(|| blank(&envelope.kind, envelope.version, "pedido_id"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::{json, Value};

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
                .starts_with("esquema: `pedido.pagado` version 1 cannot be read"),
            "{err}"
        );
        let no_city = paid(
            2,
            json!({"pedido_id": "P-1", "direccion_entrega": {"calle": "x"}}),
        );
        assert!(matches!(
            PaidOrder::from_envelope(&no_city),
            Err(DeliveryError::Schema(ContractError::Invalid { ref field, .. })) if field == "direccion_entrega"
        ));
        let bad_id = paid(
            2,
            json!({"pedido_id": 7, "direccion_entrega": {"ciudad": "x", "calle": "y"}}),
        );
        assert!(matches!(
            PaidOrder::from_envelope(&bad_id),
            Err(DeliveryError::Schema(ContractError::Invalid { ref field, .. })) if field == "pedido_id"
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
