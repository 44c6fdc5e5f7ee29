//! The seed's JSON event envelope and its validating parser.
//!
//! Wire form (field names are the contract and never change):
//! `{"id_evento": "<uuid>", "tipo": "pedido.creado", "version": 1, "fecha_ms": <epoch ms>,
//!   "origen": "pedidos", "datos": {...}}`. Unknown fields are ignored on read.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

/// Default largest accepted envelope, in bytes (1 MiB).
pub const DEFAULT_MAX_BYTES: usize = 1024 * 1024;
/// Default deepest accepted nesting of JSON objects and arrays.
pub const DEFAULT_MAX_DEPTH: usize = 32;

/// An event as it travels between services.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Unique, producer-generated id; the idempotency key of every consumer (`id_evento`).
    #[serde(rename = "id_evento")]
    pub id: Uuid,
    /// Event type, e.g. `pedido.creado` (`tipo`).
    #[serde(rename = "tipo")]
    pub kind: String,
    /// Schema version of `datos`, starting at 1.
    pub version: u32,
    /// Creation time in milliseconds since the Unix epoch (`fecha_ms`).
    #[serde(rename = "fecha_ms")]
    pub timestamp_ms: i64,
    /// Producing service, e.g. `pedidos` (`origen`).
    #[serde(rename = "origen")]
    pub source: String,
    /// The event's payload (`datos`).
    #[serde(rename = "datos")]
    pub data: Value,
}

/// Limits applied while parsing an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted message, in bytes.
    pub max_bytes: usize,
    /// Deepest accepted nesting of objects and arrays.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// Why a message is not a valid envelope. Every variant is permanent: retrying cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The message is larger than the configured limit.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Size of the message.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
    /// The JSON nests deeper than the configured limit.
    #[error("json nesting exceeds the limit of {limit} levels")]
    TooDeep {
        /// Configured limit.
        limit: usize,
    },
    /// The bytes are not valid UTF-8 JSON.
    #[error("malformed json at line {line}, column {column}: {message}")]
    Malformed {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's description.
        message: String,
    },
    /// The top-level JSON value is not an object.
    #[error("envelope must be a json object")]
    NotAnObject,
    /// A required field is absent.
    #[error("missing field `{field}`")]
    MissingField {
        /// The wire name of the field.
        field: &'static str,
    },
    /// A field is present but its value is not acceptable.
    #[error("invalid field `{field}`: {reason}")]
    InvalidField {
        /// The wire name of the field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl EnvelopeError {
    /// The wire name of the offending field, when the error concerns one field.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::MissingField { field } | Self::InvalidField { field, .. } => Some(field),
            _ => None,
        }
    }
}

impl Envelope {
    /// Builds a new envelope with a fresh random id and the current time.
    pub fn new(kind: impl Into<String>, source: impl Into<String>, data: Value) -> Self {
        Self {
            id: Uuid::new_v4(),
            kind: kind.into(),
            version: 1,
            timestamp_ms: now_ms(),
            source: source.into(),
            data,
        }
    }

    /// Parses and validates an envelope with the default [`Limits`].
    pub fn parse(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Self::parse_with(bytes, &Limits::default())
    }

    /// Parses and validates an envelope: size, depth, required fields and their values.
    pub fn parse_with(bytes: &[u8], limits: &Limits) -> Result<Self, EnvelopeError> {
        if bytes.len() > limits.max_bytes {
            return Err(EnvelopeError::TooLarge {
                size: bytes.len(),
                limit: limits.max_bytes,
            });
        }
        // Checked before serde builds a tree, so a hostile message cannot exhaust the stack.
        if nesting_depth(bytes) > limits.max_depth {
            return Err(EnvelopeError::TooDeep {
                limit: limits.max_depth,
            });
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| EnvelopeError::Malformed {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        let Value::Object(mut map) = value else {
            return Err(EnvelopeError::NotAnObject);
        };
        Ok(Self {
            id: parse_id(&map)?,
            kind: required_text(&map, "tipo")?,
            version: parse_version(&map)?,
            timestamp_ms: parse_timestamp(&map)?,
            source: required_text(&map, "origen")?,
            data: map
                .remove("datos")
                .ok_or(EnvelopeError::MissingField { field: "datos" })?,
        })
    }

    /// Serializes the envelope to its wire form.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing a struct of plain strings, numbers and a `Value` cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

fn field<'a>(map: &'a Map<String, Value>, name: &'static str) -> Result<&'a Value, EnvelopeError> {
    match map.get(name) {
        None | Some(Value::Null) => Err(EnvelopeError::MissingField { field: name }),
        Some(v) => Ok(v),
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> EnvelopeError {
    EnvelopeError::InvalidField {
        field,
        reason: reason.into(),
    }
}

fn parse_id(map: &Map<String, Value>) -> Result<Uuid, EnvelopeError> {
    let text = field(map, "id_evento")?
        .as_str()
        .ok_or_else(|| invalid("id_evento", "must be a string"))?;
    Uuid::parse_str(text).map_err(|e| invalid("id_evento", format!("not a uuid: {e}")))
}

fn required_text(map: &Map<String, Value>, name: &'static str) -> Result<String, EnvelopeError> {
    let text = field(map, name)?
        .as_str()
        .ok_or_else(|| invalid(name, "must be a string"))?;
    if text.trim().is_empty() {
        return Err(invalid(name, "must not be empty"));
    }
    Ok(text.to_owned())
}

fn parse_version(map: &Map<String, Value>) -> Result<u32, EnvelopeError> {
    let value = field(map, "version")?;
    let number = value
        .as_u64()
        .ok_or_else(|| invalid("version", "must be a positive integer"))?;
    match u32::try_from(number) {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(invalid("version", format!("must be >= 1, got {number}"))),
    }
}

fn parse_timestamp(map: &Map<String, Value>) -> Result<i64, EnvelopeError> {
    field(map, "fecha_ms")?
        .as_i64()
        .ok_or_else(|| invalid("fecha_ms", "must be an integer number of milliseconds"))
}

/// Deepest nesting of `{`/`[` outside string literals; cheap and allocation-free.
fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Milliseconds since the Unix epoch, from the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
