//! An AsyncAPI 3.0 description of a system's channels, generated from its [`Catalog`]: each
//! topic or queue with the messages it carries (the seed's envelope around each contract's
//! `datos`, or the bare body on a request/reply queue), the headers, the key, and which
//! services send and receive there.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::{Catalog, Contract};

/// What the catalog does not say about a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// The topic or queue (`pedidos.eventos`).
    pub address: String,
    /// What travels there, for a person.
    pub description: String,
    /// What the records are keyed by (`the order id`), if they are keyed.
    pub key: Option<String>,
    /// Whether messages travel in the seed's envelope (`false`: bare request/reply bodies).
    pub envelope: bool,
    /// The services that send on it.
    pub senders: Vec<String>,
    /// The services (consumer groups) that receive from it.
    pub receivers: Vec<String>,
}

/// The document's title, version and description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The system's name.
    pub title: String,
    /// Its version.
    pub version: String,
    /// What it is.
    pub description: String,
}

/// The AsyncAPI 3.0 document of `catalog` over `channels` (a contract whose channel is not
/// listed is left out).
pub fn document(catalog: &Catalog, info: &Info, channels: &[Channel]) -> Value {
    let mut channel_docs = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    let mut schemas = Map::new();
    for channel in channels {
        let id = ident(&channel.address);
        let mut carried = Map::new();
        for contract in catalog.contracts().filter(|c| c.channel == channel.address) {
            let name = message_id(contract);
            messages.insert(name.clone(), message(contract, channel, &mut schemas));
            carried.insert(
                name.clone(),
                json!({"$ref": format!("#/components/messages/{name}")}),
            );
        }
        let refs: Vec<Value> = carried
            .keys()
            .map(|m| json!({"$ref": format!("#/channels/{id}/messages/{m}")}))
            .collect();
        channel_docs.insert(
            id.clone(),
            json!({"address": channel.address, "description": channel.description, "messages": carried}),
        );
        for (action, services) in [("send", &channel.senders), ("receive", &channel.receivers)] {
            for service in services {
                operations.insert(
                    format!("{}_{action}s_{id}", ident(service)),
                    json!({
                        "action": action,
                        "channel": {"$ref": format!("#/channels/{id}")},
                        "summary": format!("{service} {action}s on {}", channel.address),
                        "messages": refs,
                    }),
                );
            }
        }
    }
    json!({
        "asyncapi": "3.0.0",
        "info": {"title": info.title, "version": info.version, "description": info.description},
        "defaultContentType": "application/json",
        "channels": channel_docs,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    })
}

/// `pedido.creado` v1 → `pedido_creado_v1`.
fn message_id(contract: &Contract) -> String {
    format!("{}_v{}", ident(&contract.tipo), contract.version)
}

fn ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn message(contract: &Contract, channel: &Channel, schemas: &mut Map<String, Value>) -> Value {
    let id = message_id(contract);
    let datos = lift(&contract.schema, &id, schemas);
    let payload = if channel.envelope {
        json!({
            "type": "object",
            "required": ["id_evento", "tipo", "version", "fecha_ms", "origen", "datos"],
            "properties": {
                "id_evento": {"type": "string", "format": "uuid",
                              "description": "The event's id: every consumer's idempotency key."},
                "tipo": {"const": contract.tipo},
                "version": {"const": contract.version},
                "fecha_ms": {"type": "integer", "description": "Creation time, ms since the Unix epoch."},
                "origen": {"type": "string", "description": "The producing service."},
                "datos": datos,
            },
        })
    } else {
        datos
    };
    let mut message = json!({
        "name": contract.tipo,
        "title": format!("{} v{}", contract.tipo, contract.version),
        "summary": contract.summary,
        "contentType": "application/json",
        "payload": payload,
    });
    if channel.envelope {
        message["headers"] = json!({
            "type": "object",
            "properties": {
                "tipo": {"const": contract.tipo},
                "id_evento": {"type": "string", "format": "uuid"},
                "traceparent": {"type": "string", "description": "W3C trace context of the producing transaction."},
            },
        });
    }
    if let Some(key) = &channel.key {
        message["bindings"] = json!({"kafka": {"key": {"type": "string", "description": key}}});
    }
    message
}

/// The contract's schema without its document keywords, its `$defs` moved to the components
/// under `<message>.<name>` and every `$ref` rewritten to match.
fn lift(schema: &Value, id: &str, schemas: &mut Map<String, Value>) -> Value {
    let mut schema = schema.clone();
    let defs: BTreeMap<String, Value> = match schema.as_object_mut() {
        Some(map) => {
            map.remove("$schema");
            map.remove("title");
            match map.remove("$defs") {
                Some(Value::Object(defs)) => defs.into_iter().collect(),
                _ => BTreeMap::new(),
            }
        }
        None => BTreeMap::new(),
    };
    for (name, mut def) in defs {
        rewrite_refs(&mut def, id);
        schemas.insert(format!("{id}.{name}"), def);
    }
    rewrite_refs(&mut schema, id);
    schema
}

fn rewrite_refs(value: &mut Value, id: &str) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get_mut("$ref") {
                if let Some(name) = target.strip_prefix("#/$defs/") {
                    *target = format!("#/components/schemas/{id}.{name}");
                }
            }
            map.values_mut().for_each(|v| rewrite_refs(v, id));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_refs(v, id)),
        _ => {}
    }
}
