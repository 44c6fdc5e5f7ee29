//! Whether every value one schema (the writer's) accepts is accepted by another (the
//! reader's). Sound where it says yes for the keywords `node` reads; where it cannot prove
//! it, it says no and names the place, which is the side a compatibility check must err on.

use serde_json::Value;

use super::node::{alternatives, Additional, Alt, Object, Range};
use super::{Problem, SchemaError};

/// A reader document and a writer document being compared.
pub(super) struct Pair<'a> {
    pub reader: &'a Value,
    pub writer: &'a Value,
}

/// How deep two schemas are compared before the check gives up (a recursive type).
const MAX_DEPTH: usize = 64;

impl<'a> Pair<'a> {
    /// The problems that keep `reader` (a node of the reader's document) from accepting
    /// everything `writer` (a node of the writer's) does; empty when it does.
    pub fn accepts(
        &self,
        reader: &'a Value,
        writer: &'a Value,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Problem>, SchemaError> {
        if depth > MAX_DEPTH {
            return Err(SchemaError::new(at, "the schemas nest too deep to compare"));
        }
        let readers = alternatives(self.reader, reader, at)?;
        let writers = alternatives(self.writer, writer, at)?;
        let mut problems = Vec::new();
        for w in &writers {
            problems.extend(self.one_of(&readers, w, at, depth)?);
        }
        Ok(problems)
    }

    /// The problems of `w` against the reader's alternatives: none if one of them accepts it,
    /// else those of the alternative of the same kind (the likeliest intended match).
    fn one_of(
        &self,
        readers: &[Alt<'a>],
        w: &Alt<'a>,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Problem>, SchemaError> {
        let mut closest = None;
        for r in readers {
            let problems = self.alt(r, w, at, depth)?;
            if problems.is_empty() {
                return Ok(problems);
            }
            if closest.is_none() && same_kind(r, w) {
                closest = Some(problems);
            }
        }
        Ok(closest.unwrap_or_else(|| {
            let kinds: Vec<&str> = readers.iter().map(Alt::kind).collect();
            let accepted = if kinds.is_empty() {
                "nothing".to_owned()
            } else {
                kinds.join(" or ")
            };
            vec![Problem::new(
                at,
                format!(
                    "type changed: the writer may send {}, the reader accepts {accepted}",
                    w.kind()
                ),
            )]
        }))
    }

    fn alt(
        &self,
        r: &Alt<'a>,
        w: &Alt<'a>,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Problem>, SchemaError> {
        let problem = |text: String| Ok(vec![Problem::new(at, text)]);
        match (r, w) {
            (Alt::Any, _) => Ok(Vec::new()),
            (_, Alt::Any) => problem(format!(
                "the reader accepts only {}, the writer any value",
                r.kind()
            )),
            (_, Alt::Values(values)) => {
                let mut problems = Vec::new();
                for value in values {
                    if !self.value_fits(r, value, at, depth)? {
                        problems.push(Problem::new(
                            at,
                            format!("the writer may send {value}, which the reader refuses"),
                        ));
                    }
                }
                Ok(problems)
            }
            (Alt::Values(values), _) => problem(format!(
                "the reader accepts only {} fixed value(s), the writer any {}: the set was tightened",
                values.len(),
                w.kind()
            )),
            (Alt::Null, Alt::Null) | (Alt::Boolean, Alt::Boolean) => Ok(Vec::new()),
            (Alt::Integer(rr) | Alt::Number(rr), Alt::Integer(wr))
            | (Alt::Number(rr), Alt::Number(wr)) => Ok(range(rr, wr, at, "value")),
            (Alt::Integer(_), Alt::Number(_)) => {
                problem("type narrowed from number to integer".to_owned())
            }
            (
                Alt::String {
                    length: rl,
                    pattern: rp,
                },
                Alt::String {
                    length: wl,
                    pattern: wp,
                },
            ) => {
                let mut problems = range(rl, wl, at, "length");
                if rp.is_some() && rp != wp {
                    problems.push(Problem::new(
                        at,
                        format!("the reader requires the pattern {rp:?}, the writer {wp:?}"),
                    ));
                }
                Ok(problems)
            }
            (
                Alt::Array {
                    items: ri,
                    length: rl,
                },
                Alt::Array {
                    items: wi,
                    length: wl,
                },
            ) => {
                let mut problems = range(rl, wl, at, "number of items");
                let items = format!("{at}[]");
                problems.extend(self.either(*ri, *wi, &items, depth)?);
                Ok(problems)
            }
            (Alt::Object(ro), Alt::Object(wo)) => self.object(ro, wo, at, depth),
            _ => problem(format!(
                "type changed: the writer may send {}, the reader accepts {}",
                w.kind(),
                r.kind()
            )),
        }
    }

    /// Optional subschemas (absent accepts anything).
    fn either(
        &self,
        reader: Option<&'a Value>,
        writer: Option<&'a Value>,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Problem>, SchemaError> {
        const ANY: &Value = &Value::Bool(true);
        let reader = reader.unwrap_or(ANY);
        let writer = writer.unwrap_or(ANY);
        self.accepts(reader, writer, at, depth + 1)
    }

    fn object(
        &self,
        r: &Object<'a>,
        w: &Object<'a>,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Problem>, SchemaError> {
        let mut problems = Vec::new();
        for (name, reader) in &r.properties {
            let here = member(at, name);
            match w.property(name) {
                Some(writer) => {
                    problems.extend(self.accepts(reader, writer, &here, depth + 1)?);
                    if r.requires(name) && !w.requires(name) {
                        problems.push(Problem::new(
                            &here,
                            "required by the reader, optional for the writer",
                        ));
                    }
                }
                None if r.requires(name) => problems.push(Problem::new(
                    &here,
                    "required by the reader, absent from the writer (a field added as \
                     required, or renamed)",
                )),
                None => match w.additional {
                    Additional::Closed => {}
                    Additional::Open => {
                        if !matches!(alternatives(self.reader, reader, &here)?[..], [Alt::Any]) {
                            problems.push(Problem::new(
                                &here,
                                "the writer's open content model may carry this member with \
                                 any value, and the reader constrains it",
                            ));
                        }
                    }
                    Additional::Schema(writer) => {
                        problems.extend(self.accepts(reader, writer, &here, depth + 1)?);
                    }
                },
            }
        }
        for (name, writer) in &w.properties {
            if r.property(name).is_some() {
                continue;
            }
            let here = member(at, name);
            match r.additional {
                Additional::Open => {}
                Additional::Closed => problems.push(Problem::new(
                    &here,
                    "the writer may send this member; the reader's closed content model \
                     no longer accepts it (a field removed or renamed)",
                )),
                Additional::Schema(reader) => {
                    problems.extend(self.accepts(reader, writer, &here, depth + 1)?);
                }
            }
        }
        let rest = format!("{at}.*");
        match (r.additional, w.additional) {
            (_, Additional::Closed) | (Additional::Open, _) => {}
            (Additional::Closed, _) => problems.push(Problem::new(
                &rest,
                "the reader closed the content model the writer leaves open",
            )),
            (Additional::Schema(reader), Additional::Open) => {
                if !matches!(alternatives(self.reader, reader, &rest)?[..], [Alt::Any]) {
                    problems.push(Problem::new(
                        &rest,
                        "the reader constrains members the writer leaves open",
                    ));
                }
            }
            (Additional::Schema(reader), Additional::Schema(writer)) => {
                problems.extend(self.accepts(reader, writer, &rest, depth + 1)?);
            }
        }
        Ok(problems)
    }

    /// Whether the reader's alternative `r` accepts `value`.
    fn value_fits(
        &self,
        r: &Alt<'a>,
        value: &Value,
        at: &str,
        depth: usize,
    ) -> Result<bool, SchemaError> {
        if depth > MAX_DEPTH {
            return Err(SchemaError::new(at, "the schemas nest too deep to compare"));
        }
        Ok(match (r, value) {
            (Alt::Any, _) => true,
            (Alt::Values(values), v) => values.contains(&v),
            (Alt::Null, Value::Null) | (Alt::Boolean, Value::Bool(_)) => true,
            (Alt::Integer(range), Value::Number(n)) => n
                .as_f64()
                .is_some_and(|f| f.fract() == 0.0 && range.holds(f)),
            (Alt::Number(range), Value::Number(n)) => n.as_f64().is_some_and(|f| range.holds(f)),
            (Alt::String { length, pattern }, Value::String(s)) => {
                // A pattern cannot be evaluated here: refuse rather than guess.
                pattern.is_none() && length.holds(s.chars().count() as f64)
            }
            (Alt::Array { items, length }, Value::Array(elements)) => {
                if !length.holds(elements.len() as f64) {
                    return Ok(false);
                }
                for element in elements {
                    if !self.value_valid(*items, element, at, depth + 1)? {
                        return Ok(false);
                    }
                }
                true
            }
            (Alt::Object(o), Value::Object(members)) => {
                if o.required.iter().any(|name| !members.contains_key(*name)) {
                    return Ok(false);
                }
                for (name, member) in members {
                    let schema = match (o.property(name), o.additional) {
                        (Some(schema), _) | (None, Additional::Schema(schema)) => Some(schema),
                        (None, Additional::Open) => None,
                        (None, Additional::Closed) => return Ok(false),
                    };
                    if !self.value_valid(schema, member, at, depth + 1)? {
                        return Ok(false);
                    }
                }
                true
            }
            _ => false,
        })
    }

    /// Whether `value` is valid against the reader's subschema (absent: anything).
    fn value_valid(
        &self,
        schema: Option<&'a Value>,
        value: &Value,
        at: &str,
        depth: usize,
    ) -> Result<bool, SchemaError> {
        let Some(schema) = schema else {
            return Ok(true);
        };
        for alt in alternatives(self.reader, schema, at)? {
            if self.value_fits(&alt, value, at, depth)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn same_kind(r: &Alt<'_>, w: &Alt<'_>) -> bool {
    std::mem::discriminant(r) == std::mem::discriminant(w)
        || matches!(
            (r, w),
            (Alt::Number(_), Alt::Integer(_)) | (Alt::Integer(_), Alt::Number(_))
        )
}

fn range(reader: &Range, writer: &Range, at: &str, what: &str) -> Vec<Problem> {
    if reader.contains(writer) {
        Vec::new()
    } else {
        vec![Problem::new(
            at,
            format!(
                "the {what}'s bounds were tightened: the writer allows values the reader refuses"
            ),
        )]
    }
}

/// The path of member `name` below `at`.
fn member(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}
