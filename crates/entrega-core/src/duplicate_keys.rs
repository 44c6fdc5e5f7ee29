//! Finding a key written twice in one JSON object. JSON parsers disagree on such objects
//! (serde_json keeps the last value, others the first), so a body that two services read
//! differently is refused at the edge instead.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Where the first key written twice is: `lineas[0].producto`, or the key alone at the top
/// level. `None` when every object has distinct keys, and for text that is not JSON (whose
/// parser reports it).
pub fn first_duplicate_key(json: &[u8]) -> Option<String> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    (Node {
        path: String::new(),
    })
    .deserialize(&mut deserializer)
    .unwrap_or_default()
}

/// One value at `path`; what it finds is the path of a duplicate key under it.
struct Node {
    path: String,
}

impl<'de> DeserializeSeed<'de> for Node {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Node {
    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

impl<'de> Visitor<'de> for Node {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            let path = self.child(&key);
            if found.is_none() && !seen.insert(key) {
                found = Some(path.clone());
            }
            let below = map.next_value_seed(Node { path })?;
            found = found.or(below);
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut index = 0usize;
        while let Some(below) = seq.next_element_seed(Node {
            path: format!("{}[{index}]", self.path),
        })? {
            found = found.or(below);
            index += 1;
        }
        Ok(found)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_key_written_twice_is_found_with_its_path() {
        let cases: [(&str, Option<&str>); 6] = [
            (r#"{"id": "P-1", "id": "P-2"}"#, Some("id")),
            (
                r#"{"lineas": [{"producto": "a"}, {"producto": "b", "producto": "c"}]}"#,
                Some("lineas[1].producto"),
            ),
            (r#"{"a": {"b": 1, "c": {"d": 1, "d": 2}}}"#, Some("a.c.d")),
            (r#"{"a": 1, "b": {"a": 1}}"#, None),
            (r#"[{"x": 1}, {"x": 2}]"#, None),
            ("not json", None),
        ];
        for (json, want) in cases {
            assert_eq!(
                first_duplicate_key(json.as_bytes()).as_deref(),
                want,
                "{json}"
            );
        }
    }
}
