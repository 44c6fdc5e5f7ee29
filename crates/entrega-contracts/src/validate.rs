//! Checking a value against a contract's schema, naming the first member that fails. Reads
//! the same keywords as the compatibility check (`compat`), and refuses a schema it cannot
//! read rather than passing the value.

use serde_json::Value;

use crate::compat::node::{alternatives, Additional, Alt};

/// How deep a value is checked; deeper values fail (the envelope's own limit is lower).
const MAX_DEPTH: usize = 128;

/// The first place where `value` fails `schema`: its path (`lineas[0].cantidad`, empty for
/// the whole value) and why.
pub(crate) fn first_failure(schema: &Value, value: &Value) -> Option<(String, String)> {
    check(schema, schema, value, "", 0).err()
}

/// The first place where `value` fails `schema`, whose local `$ref`s resolve in `root` (a
/// contract's schema with its `$defs`, an OpenAPI document with its `components`): the path
/// and why; `None` when it fits.
pub fn first_failure_in(root: &Value, schema: &Value, value: &Value) -> Option<(String, String)> {
    check(root, schema, value, "", 0).err()
}

fn check(
    root: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
    depth: usize,
) -> Result<(), (String, String)> {
    if depth > MAX_DEPTH {
        return Err((at.to_owned(), "nests too deep".to_owned()));
    }
    let alts = alternatives(root, schema, at).map_err(|e| (e.path, e.reason))?;
    let mut closest = None;
    for alt in &alts {
        match fits(root, alt, value, at, depth) {
            Ok(()) => return Ok(()),
            // The failure inside the alternative of the value's own kind says the most.
            Err(failure) if closest.is_none() || failure.0 != at => closest = Some(failure),
            Err(_) => {}
        }
    }
    Err(closest.unwrap_or_else(|| (at.to_owned(), "no value is allowed here".to_owned())))
}

fn fits(
    root: &Value,
    alt: &Alt<'_>,
    value: &Value,
    at: &str,
    depth: usize,
) -> Result<(), (String, String)> {
    let fail = |why: String| Err((at.to_owned(), why));
    match (alt, value) {
        (Alt::Any, _) | (Alt::Null, Value::Null) | (Alt::Boolean, Value::Bool(_)) => Ok(()),
        (Alt::Values(values), v) => {
            if values.contains(&v) {
                Ok(())
            } else {
                let allowed: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                fail(format!("is {v}, not one of {}", allowed.join(", ")))
            }
        }
        (Alt::Integer(range), Value::Number(n)) => match n.as_f64() {
            Some(f) if f.fract() != 0.0 => fail(format!("is {n}, not an integer")),
            Some(f) if range.holds(f) => Ok(()),
            _ => fail(format!("is {n}, out of range")),
        },
        (Alt::Number(range), Value::Number(n)) => match n.as_f64() {
            Some(f) if range.holds(f) => Ok(()),
            _ => fail(format!("is {n}, out of range")),
        },
        (Alt::String { length, pattern }, Value::String(s)) => {
            if !length.holds(s.chars().count() as f64) {
                return fail(format!(
                    "has {} characters, out of range",
                    s.chars().count()
                ));
            }
            match pattern {
                None => Ok(()),
                Some(p) => match regex::Regex::new(p) {
                    Ok(re) if re.is_match(s.as_str()) => Ok(()),
                    Ok(_) => fail(format!("does not match the pattern {p:?}")),
                    Err(e) => fail(format!("has a pattern that does not compile: {e}")),
                },
            }
        }
        (Alt::Array { items, length }, Value::Array(elements)) => {
            if !length.holds(elements.len() as f64) {
                return fail(format!("has {} items, out of range", elements.len()));
            }
            if let Some(items) = items {
                for (i, element) in elements.iter().enumerate() {
                    check(root, items, element, &format!("{at}[{i}]"), depth + 1)?;
                }
            }
            Ok(())
        }
        (Alt::Object(o), Value::Object(members)) => {
            if let Some(missing) = o.required.iter().find(|name| !members.contains_key(**name)) {
                return Err((join(at, missing), "is required and missing".to_owned()));
            }
            for (name, member) in members {
                let here = join(at, name);
                match (o.property(name), o.additional) {
                    (Some(schema), _) | (None, Additional::Schema(schema)) => {
                        check(root, schema, member, &here, depth + 1)?;
                    }
                    (None, Additional::Open) => {}
                    (None, Additional::Closed) => {
                        return Err((here, "is not part of the contract".to_owned()));
                    }
                }
            }
            Ok(())
        }
        (alt, v) => fail(format!("should be {}, is {}", alt.kind(), kind_of(v))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}
