//! A JSON document kept as its text.
//!
//! The relay never looks inside an event's payload: it reads `carga` from the outbox and writes
//! it into the envelope's `datos`. Keeping it as validated text on that path saves building a
//! tree of maps and strings per event and serialising it again.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// A valid JSON document held as text, written out verbatim when serialised.
///
/// Two values are equal when they hold the same JSON value, whatever their spacing or key
/// order (`{"a": 1}` equals `{"a":1}`); compare with a [`Value`] directly.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Validates `text` as one JSON document and keeps it as is.
    pub fn parse(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(Self)
    }

    /// The compact text of `value`.
    pub fn from_value(value: &Value) -> Self {
        // Serialising a `Value` to text cannot fail, and its output is always valid JSON.
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => Self(raw),
            Err(_) => Self::null(),
        }
    }

    /// The JSON `null`.
    pub fn null() -> Self {
        Self(RawValue::NULL.to_owned())
    }

    /// The document's text, exactly as held.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The document parsed into a [`Value`].
    ///
    /// The text was validated when this value was made, so parsing it again succeeds; were it
    /// ever to fail, the result is `null` rather than a panic.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str() || self.to_value() == other.to_value()
    }
}

impl PartialEq<Value> for RawJson {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl From<Value> for RawJson {
    fn from(value: Value) -> Self {
        Self::from_value(&value)
    }
}

impl From<&Value> for RawJson {
    fn from(value: &Value) -> Self {
        Self::from_value(value)
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_the_text_and_serialises_it_verbatim() {
        let raw = RawJson::parse(r#"{"b": 1,  "a": [true, null]}"#.to_owned()).unwrap();
        assert_eq!(raw.as_str(), r#"{"b": 1,  "a": [true, null]}"#);
        let wrapped = serde_json::to_string(&json!({"x": 1})).unwrap();
        assert_eq!(wrapped, r#"{"x":1}"#);
        #[derive(Serialize)]
        struct Outer<'a> {
            datos: &'a RawJson,
        }
        let out = serde_json::to_string(&Outer { datos: &raw }).unwrap();
        assert_eq!(out, r#"{"datos":{"b": 1,  "a": [true, null]}}"#);
    }

    #[test]
    fn refuses_what_is_not_one_json_document() {
        for bad in ["", "{", "{\"a\":1} x", "nope", "[1,]"] {
            assert!(RawJson::parse(bad.to_owned()).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn equality_is_by_value_not_by_spelling() {
        let spaced = RawJson::parse(r#"{"a": 1, "b": "x"}"#.to_owned()).unwrap();
        let compact = RawJson::from_value(&json!({"b": "x", "a": 1}));
        assert_eq!(spaced, compact);
        assert_eq!(spaced, json!({"a": 1, "b": "x"}));
        assert_ne!(spaced, json!({"a": 2, "b": "x"}));
        assert_eq!(spaced.to_value(), json!({"a": 1, "b": "x"}));
    }

    #[test]
    fn round_trips_through_serde() {
        let raw = RawJson::from_value(&json!({"n": [1, 2.5, "ñ"]}));
        let text = serde_json::to_string(&raw).unwrap();
        let back: RawJson = serde_json::from_str(&text).unwrap();
        assert_eq!(back, raw);
        assert_eq!(RawJson::null().to_value(), Value::Null);
    }
}
