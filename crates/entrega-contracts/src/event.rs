//! An event as a Rust type that knows its `tipo` and `version`, and the JSON Schema of its
//! `datos`, generated from the type with a closed content model.

use schemars::generate::SchemaSettings;
use schemars::transform::{transform_subschemas, Transform};
use schemars::{JsonSchema, Schema};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use entrega_core::{ContractError, NewEvent};

/// An event, command or reply whose `datos` this type describes, at one `version` of its
/// `tipo`. Reading ignores members the type does not know (the seed's tolerant reader);
/// its schema ([`schema_of`]) lists exactly what the type writes.
///
/// ```
/// use entrega_contracts::Event;
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct PedidoPagado {
///     id: String,
///     importe_centimos: i64,
/// }
///
/// impl Event for PedidoPagado {
///     const TIPO: &'static str = "pedido.pagado";
///     const VERSION: u32 = 1;
/// }
///
/// let schema = entrega_contracts::schema_of::<PedidoPagado>();
/// assert_eq!(schema["additionalProperties"], false);
/// assert_eq!(schema["title"], "pedido.pagado v1");
/// ```
pub trait Event: Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static {
    /// The event type (`tipo`), e.g. `pedido.creado`.
    const TIPO: &'static str;
    /// The schema version of `datos` this type is, starting at 1.
    const VERSION: u32;

    /// This event as `datos`.
    fn datos(&self) -> Result<Value, ContractError> {
        serde_json::to_value(self).map_err(|e| ContractError::Invalid {
            tipo: Self::TIPO.to_owned(),
            version: Self::VERSION,
            field: "datos".to_owned(),
            reason: e.to_string(),
        })
    }

    /// This event as an outbox row of `aggregate` `aggregate_id` (`agregado`,
    /// `agregado_id`), with a fresh `id_evento`.
    fn outgoing(&self, aggregate: &str, aggregate_id: &str) -> Result<NewEvent, ContractError> {
        let mut event = NewEvent::new(aggregate, aggregate_id, Self::TIPO, self.datos()?);
        event.version = Self::VERSION;
        Ok(event)
    }
}

/// What a consumer reads of one `tipo`: a type that may know fewer members than the event
/// carries, read as it is from each version in `VERSIONS` (the seed's "consumers accept
/// both"), and from older versions through upcasters to the newest of them. Every [`Event`]
/// is a view of its own version.
///
/// ```
/// use entrega_contracts::View;
///
/// /// What a stock consumer needs of `pedido.creado`, the same in versions 1 and 2.
/// #[derive(serde::Deserialize)]
/// struct Lineas {
///     lineas: Vec<serde_json::Value>,
/// }
///
/// impl View for Lineas {
///     const TIPO: &'static str = "pedido.creado";
///     const VERSIONS: &'static [u32] = &[1, 2];
/// }
/// ```
pub trait View: DeserializeOwned + Send + 'static {
    /// The event type (`tipo`) read.
    const TIPO: &'static str;
    /// The versions read as they are, oldest first; never empty.
    const VERSIONS: &'static [u32];
}

impl<E: Event> View for E {
    const TIPO: &'static str = E::TIPO;
    const VERSIONS: &'static [u32] = &[E::VERSION];
}

/// The JSON Schema (draft 2020-12) of `E`'s `datos`: every object closed
/// (`additionalProperties: false`) unless the type says otherwise, titled `<tipo> v<version>`.
pub fn schema_of<E: Event>() -> Value {
    let mut schema = SchemaSettings::draft2020_12()
        .with_transform(ClosedObjects)
        .into_generator()
        .into_root_schema_for::<E>();
    schema.insert(
        "title".to_owned(),
        Value::String(format!("{} v{}", E::TIPO, E::VERSION)),
    );
    schema.to_value()
}

/// Closes every object schema that does not say whether it is open: the contract lists every
/// member a producer may write, so a member added later is provably optional (see
/// [`crate::compat`]).
#[derive(Debug, Clone, Copy)]
struct ClosedObjects;

impl Transform for ClosedObjects {
    fn transform(&mut self, schema: &mut Schema) {
        let describes_members = schema.get("properties").is_some()
            || schema.get("type").and_then(Value::as_str) == Some("object");
        if describes_members && schema.get("additionalProperties").is_none() {
            schema.insert("additionalProperties".to_owned(), Value::Bool(false));
        }
        transform_subschemas(self, schema);
    }
}
