//! A JSON Schema node read as the set of alternatives it accepts: the shape the compatibility
//! check compares. Only what describes the data is read; annotations are skipped, and any
//! other keyword is refused, so an unsupported schema never passes the check by being ignored.

use serde_json::{Map, Value};

use super::SchemaError;

/// Keywords that only annotate a schema: they never change which data it accepts.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "format",
];

/// Keywords this module reads.
const UNDERSTOOD: &[&str] = &[
    "$ref",
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// How many `$ref`s may be followed in a row before the schema counts as circular.
const MAX_REFS: usize = 32;

/// One end of a [`Range`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bound {
    pub value: f64,
    /// The end itself is outside the range (`exclusiveMinimum`, `exclusiveMaximum`).
    pub exclusive: bool,
}

/// Bounds on a number or a count: `None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Range {
    pub min: Option<Bound>,
    pub max: Option<Bound>,
}

impl Range {
    /// Whether every value within `inner` is within `self`.
    pub fn contains(&self, inner: &Range) -> bool {
        // `outer` lets in at least what `inner` does at this end; `below` says which way
        // "further out" is.
        fn covers(outer: Option<Bound>, inner: Option<Bound>, below: bool) -> bool {
            match (outer, inner) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(o), Some(i)) if o.value == i.value => !o.exclusive || i.exclusive,
                (Some(o), Some(i)) => (o.value < i.value) == below,
            }
        }
        covers(self.min, inner.min, true) && covers(self.max, inner.max, false)
    }

    /// Whether `n` is within the bounds.
    pub fn holds(&self, n: f64) -> bool {
        let above = self
            .min
            .is_none_or(|b| n > b.value || (n == b.value && !b.exclusive));
        let below = self
            .max
            .is_none_or(|b| n < b.value || (n == b.value && !b.exclusive));
        above && below
    }
}

/// What an object schema says of its members.
#[derive(Debug, Clone)]
pub(crate) struct Object<'a> {
    pub properties: Vec<(&'a str, &'a Value)>,
    pub required: Vec<&'a str>,
    pub additional: Additional<'a>,
}

impl<'a> Object<'a> {
    pub fn property(&self, name: &str) -> Option<&'a Value> {
        self.properties
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }

    pub fn requires(&self, name: &str) -> bool {
        self.required.contains(&name)
    }
}

/// Members beyond the named properties.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Additional<'a> {
    /// Any member (`additionalProperties` absent or `true`): an open content model.
    Open,
    /// None (`additionalProperties: false`): a closed content model.
    Closed,
    /// Members valid against this schema.
    Schema(&'a Value),
}

/// One kind of value a schema accepts, with its constraints.
#[derive(Debug, Clone)]
pub(crate) enum Alt<'a> {
    /// Anything (`true`, `{}`).
    Any,
    Null,
    Boolean,
    Integer(Range),
    Number(Range),
    String {
        length: Range,
        pattern: Option<&'a str>,
    },
    Array {
        items: Option<&'a Value>,
        length: Range,
    },
    Object(Object<'a>),
    /// Exactly these values (`enum`, `const`).
    Values(Vec<&'a Value>),
}

impl Alt<'_> {
    /// The kind's name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Alt::Any => "any value",
            Alt::Null => "null",
            Alt::Boolean => "boolean",
            Alt::Integer(_) => "integer",
            Alt::Number(_) => "number",
            Alt::String { .. } => "string",
            Alt::Array { .. } => "array",
            Alt::Object(_) => "object",
            Alt::Values(_) => "fixed values",
        }
    }
}

/// The alternatives `schema` (a node of the document `root`) accepts; none for `false`.
pub(crate) fn alternatives<'a>(
    root: &'a Value,
    schema: &'a Value,
    at: &str,
) -> Result<Vec<Alt<'a>>, SchemaError> {
    let schema = resolve(root, schema, at)?;
    let map = match schema {
        Value::Bool(true) => return Ok(vec![Alt::Any]),
        Value::Bool(false) => return Ok(Vec::new()),
        Value::Object(map) => map,
        _ => {
            return Err(SchemaError::new(
                at,
                "a schema must be an object or a boolean",
            ))
        }
    };
    if let Some(keyword) = map
        .keys()
        .find(|k| !ANNOTATIONS.contains(&k.as_str()) && !UNDERSTOOD.contains(&k.as_str()))
    {
        return Err(SchemaError::new(
            at,
            format!("keyword `{keyword}` is not supported by the compatibility check"),
        ));
    }
    if let Some(all) = map.get("allOf") {
        return match all.as_array().map(Vec::as_slice) {
            Some([only]) if map.len() == 1 => alternatives(root, only, at),
            _ => Err(SchemaError::new(
                at,
                "`allOf` is supported only with one schema and nothing beside it",
            )),
        };
    }
    for union in ["anyOf", "oneOf"] {
        if let Some(options) = map.get(union) {
            let options = options
                .as_array()
                .ok_or_else(|| SchemaError::new(at, format!("`{union}` must be an array")))?;
            let mut out = Vec::new();
            for option in options {
                out.extend(alternatives(root, option, at)?);
            }
            return Ok(out);
        }
    }
    if let Some(value) = map.get("const") {
        return Ok(vec![Alt::Values(vec![value])]);
    }
    if let Some(values) = map.get("enum") {
        let values = values
            .as_array()
            .ok_or_else(|| SchemaError::new(at, "`enum` must be an array"))?;
        return Ok(vec![Alt::Values(values.iter().collect())]);
    }
    let types: Vec<&str> = match map.get("type") {
        None => return Ok(vec![untyped(map, at)?]),
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err(SchemaError::new(at, "`type` must be a string or an array")),
    };
    types.into_iter().map(|t| typed(map, t, at)).collect()
}

/// Follows `$ref` (local JSON pointers only) to the schema it names.
fn resolve<'a>(root: &'a Value, mut schema: &'a Value, at: &str) -> Result<&'a Value, SchemaError> {
    for _ in 0..MAX_REFS {
        let Some(reference) = schema.get("$ref") else {
            return Ok(schema);
        };
        let pointer = reference
            .as_str()
            .and_then(|r| r.strip_prefix('#'))
            .ok_or_else(|| SchemaError::new(at, "only local `$ref`s (`#/...`) are supported"))?;
        schema = root
            .pointer(pointer)
            .ok_or_else(|| SchemaError::new(at, format!("`$ref` to `#{pointer}` names nothing")))?;
    }
    Err(SchemaError::new(at, "`$ref`s go round in a circle"))
}

/// A schema without `type`: an object if it describes members, otherwise anything.
fn untyped<'a>(map: &'a Map<String, Value>, at: &str) -> Result<Alt<'a>, SchemaError> {
    if map.contains_key("properties")
        || map.contains_key("required")
        || map.contains_key("additionalProperties")
    {
        return typed(map, "object", at);
    }
    Ok(Alt::Any)
}

fn typed<'a>(map: &'a Map<String, Value>, kind: &str, at: &str) -> Result<Alt<'a>, SchemaError> {
    Ok(match kind {
        "null" => Alt::Null,
        "boolean" => Alt::Boolean,
        "integer" => Alt::Integer(integer_range(map)),
        "number" => Alt::Number(numeric_range(map)),
        "string" => Alt::String {
            length: count_range(map, "minLength", "maxLength"),
            pattern: map.get("pattern").and_then(Value::as_str),
        },
        "array" => Alt::Array {
            items: map.get("items"),
            length: count_range(map, "minItems", "maxItems"),
        },
        "object" => Alt::Object(object(map, at)?),
        other => {
            return Err(SchemaError::new(
                at,
                format!("`type` `{other}` is not a JSON Schema type"),
            ))
        }
    })
}

fn object<'a>(map: &'a Map<String, Value>, at: &str) -> Result<Object<'a>, SchemaError> {
    let properties = match map.get("properties") {
        None => Vec::new(),
        Some(Value::Object(props)) => props.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        Some(_) => return Err(SchemaError::new(at, "`properties` must be an object")),
    };
    let required = match map.get("required") {
        None => Vec::new(),
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err(SchemaError::new(at, "`required` must be an array")),
    };
    let additional = match map.get("additionalProperties") {
        None | Some(Value::Bool(true)) => Additional::Open,
        Some(Value::Bool(false)) => Additional::Closed,
        Some(schema) if schema.as_object().is_some_and(Map::is_empty) => Additional::Open,
        Some(schema) => Additional::Schema(schema),
    };
    Ok(Object {
        properties,
        required,
        additional,
    })
}

/// `minimum`/`maximum` and their exclusive forms (draft 2020-12: numbers).
fn numeric_range(map: &Map<String, Value>) -> Range {
    let bound = |inclusive: &str, exclusive: &str| {
        let at = |key: &str, exclusive| {
            map.get(key)
                .and_then(Value::as_f64)
                .map(|value| Bound { value, exclusive })
        };
        at(inclusive, false).or_else(|| at(exclusive, true))
    };
    Range {
        min: bound("minimum", "exclusiveMinimum"),
        max: bound("maximum", "exclusiveMaximum"),
    }
}

/// An integer's bounds: explicit ones, else those of its `format` (`int32`, `uint64`, ...,
/// as schemars writes them for Rust's integer types), so narrowing `i64` to `i32` shows.
fn integer_range(map: &Map<String, Value>) -> Range {
    let explicit = numeric_range(map);
    let (min, max) = match map.get("format").and_then(Value::as_str) {
        Some("int8") => (f64::from(i8::MIN), f64::from(i8::MAX)),
        Some("int16") => (f64::from(i16::MIN), f64::from(i16::MAX)),
        Some("int32") => (f64::from(i32::MIN), f64::from(i32::MAX)),
        Some("int64") => (i64::MIN as f64, i64::MAX as f64),
        Some("uint8") => (0.0, f64::from(u8::MAX)),
        Some("uint16") => (0.0, f64::from(u16::MAX)),
        Some("uint32") => (0.0, f64::from(u32::MAX)),
        Some("uint64") => (0.0, u64::MAX as f64),
        _ => return explicit,
    };
    let inclusive = |value| {
        Some(Bound {
            value,
            exclusive: false,
        })
    };
    Range {
        min: explicit.min.or(inclusive(min)),
        max: explicit.max.or(inclusive(max)),
    }
}

/// `minLength`/`maxLength`, `minItems`/`maxItems`; a minimum of 0 is no bound.
fn count_range(map: &Map<String, Value>, min: &str, max: &str) -> Range {
    let bound = |key: &str| {
        map.get(key).and_then(Value::as_f64).map(|value| Bound {
            value,
            exclusive: false,
        })
    };
    Range {
        min: bound(min).filter(|b| b.value > 0.0),
        max: bound(max),
    }
}
