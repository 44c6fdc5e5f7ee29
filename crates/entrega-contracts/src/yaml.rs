//! A JSON value written as block YAML, for documents people read and diff (AsyncAPI).
//! Strings are always double-quoted (JSON's escapes are YAML's), so no value is read back as
//! another type; keys are quoted unless they are plain words.

use serde_json::Value;

/// `value` as a YAML document.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, indent: usize) {
    for (key, value) in map {
        out.push_str(&" ".repeat(indent));
        out.push_str(&key_text(key));
        out.push(':');
        write_value(out, value, indent + 2);
    }
}

fn write_seq(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match item {
            Value::Object(map) if !map.is_empty() => {
                // The first member on the dash's line, the rest aligned under it.
                let mut first = true;
                for (key, value) in map {
                    if first {
                        out.push(' ');
                        first = false;
                    } else {
                        out.push_str(&" ".repeat(indent + 2));
                    }
                    out.push_str(&key_text(key));
                    out.push(':');
                    write_value(out, value, indent + 4);
                }
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                write_seq(out, inner, indent + 2);
            }
            scalar => {
                out.push(' ');
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
    }
}

/// A member's value after `key:`: nested blocks on the next lines, scalars on the same one.
fn write_value(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, indent);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_seq(out, items, indent);
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

fn inline(value: &Value) -> String {
    match value {
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        // JSON's string, number, boolean and null forms are YAML's too.
        other => other.to_string(),
    }
}

fn key_text(key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$' | '/'))
        && !key.starts_with(['-', '.', '/'])
        && !matches!(
            key,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain && key.parse::<f64>().is_err() {
        key.to_owned()
    } else {
        Value::String(key.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_nest_and_strings_stay_strings() {
        let doc = json!({
            "asyncapi": "3.0.0",
            "n": 3,
            "empty": {},
            "list": [{"a": "x", "b": [1, 2]}, "yes", []],
            "1": {"$ref": "#/a"},
        });
        let text = to_yaml(&doc);
        let expected = "\"1\":\n  $ref: \"#/a\"\nasyncapi: \"3.0.0\"\nempty: {}\nlist:\n  - a: \"x\"\n    b:\n      - 1\n      - 2\n  - \"yes\"\n  - []\n\"n\": 3\n";
        assert_eq!(text, expected);
    }
}
