//! An outbox row from an inserted tuple of the replication stream: the same [`OutboxRow`] the
//! polling relay reads with SQL, built from the columns' text or binary output.

use entrega_core::{Headers, OutboxRow, RawJson};
use uuid::Uuid;

use super::pgoutput::{Relation, Value};

/// Why an inserted tuple is not an outbox row the relay can publish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outbox row from the replication stream: {0}")]
pub struct RowError(String);

/// The outbox columns the relay reads, by position in one relation's tuples.
#[derive(Debug, Clone)]
pub struct OutboxColumns {
    id: usize,
    aggregate: usize,
    aggregate_id: usize,
    kind: usize,
    version: usize,
    payload: usize,
    created_at: usize,
    seq: usize,
    published_at: usize,
    headers: Option<usize>,
    payload_jsonb: bool,
    headers_jsonb: bool,
}

fn is_jsonb(relation: &Relation, column: &str) -> bool {
    relation
        .position(column)
        .and_then(|at| relation.types.get(at))
        .is_some_and(|t| *t == JSONB)
}

impl OutboxColumns {
    /// The positions of the outbox's columns in `relation`; an error names a missing one.
    pub fn of(relation: &Relation) -> Result<Self, RowError> {
        let at = |name: &str| {
            relation.position(name).ok_or_else(|| {
                RowError(format!(
                    "relation {}.{} has no column `{name}`",
                    relation.namespace, relation.name
                ))
            })
        };
        Ok(Self {
            id: at("id")?,
            aggregate: at("agregado")?,
            aggregate_id: at("agregado_id")?,
            kind: at("tipo")?,
            version: at("version")?,
            payload: at("carga")?,
            created_at: at("creado_en")?,
            seq: at("seq")?,
            published_at: at("publicado_en")?,
            headers: relation.position("headers"),
            payload_jsonb: is_jsonb(relation, "carga"),
            headers_jsonb: is_jsonb(relation, "headers"),
        })
    }

    /// The row an insert carries; `None` for a row inserted already published (nothing to
    /// do, as for the polling relay). Values come in text form, or in binary form when the
    /// stream was asked for it (uuid, integers, `timestamptz`, `jsonb` and text each read in
    /// theirs).
    pub fn row(&self, values: &[Value]) -> Result<Option<OutboxRow>, RowError> {
        if !matches!(values.get(self.published_at), Some(Value::Null)) {
            return Ok(None);
        }
        let id = uuid(values, self.id)?;
        let named = |e: RowError| RowError(format!("row {id}: {}", e.0));
        let version = u32::try_from(integer(values, self.version, "version").map_err(named)?)
            .map_err(|_| RowError(format!("row {id}: version out of range")))?;
        let created_at_ms = time_ms(values, self.created_at).map_err(named)?;
        let payload =
            RawJson::parse(json(values, self.payload, self.payload_jsonb, "carga").map_err(named)?)
                .map_err(|e| RowError(format!("row {id}: carga is not JSON: {e}")))?;
        let headers = match self.headers {
            Some(at) if !matches!(values.get(at), Some(Value::Null) | None) => {
                Headers::from_json_object(
                    &json(values, at, self.headers_jsonb, "headers").map_err(named)?,
                )
            }
            _ => Headers::new(),
        };
        Ok(Some(OutboxRow {
            id,
            aggregate: text(values, self.aggregate, "agregado").map_err(named)?,
            aggregate_id: text(values, self.aggregate_id, "agregado_id").map_err(named)?,
            kind: text(values, self.kind, "tipo").map_err(named)?,
            version,
            payload,
            created_at_ms,
            seq: integer(values, self.seq, "seq").map_err(named)?,
            attempts: 0,
            headers,
        }))
    }
}

/// PostgreSQL's `jsonb` type OID: its binary form is a version byte, then the text.
const JSONB: u32 = 3802;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

fn value<'a>(values: &'a [Value], at: usize, name: &str) -> Result<&'a Value, RowError> {
    match values.get(at) {
        Some(Value::Null) => Err(RowError(format!("`{name}` is NULL"))),
        Some(Value::Unchanged) | None => Err(RowError(format!("`{name}` is missing"))),
        Some(v) => Ok(v),
    }
}

fn utf8(bytes: &[u8], name: &str) -> Result<String, RowError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| RowError(format!("`{name}` is not UTF-8")))
}

/// A text column (its binary form is the text too).
fn text(values: &[Value], at: usize, name: &str) -> Result<String, RowError> {
    match value(values, at, name)? {
        Value::Text(b) | Value::Binary(b) => utf8(b, name),
        _ => Err(RowError(format!("`{name}` is unreadable"))),
    }
}

fn uuid(values: &[Value], at: usize) -> Result<Uuid, RowError> {
    match value(values, at, "id")? {
        Value::Text(b) => {
            let t = utf8(b, "id")?;
            Uuid::parse_str(&t).map_err(|e| RowError(format!("id `{t}` is not a UUID: {e}")))
        }
        Value::Binary(b) => {
            Uuid::from_slice(b).map_err(|e| RowError(format!("id is not a UUID: {e}")))
        }
        _ => Err(RowError("`id` is unreadable".into())),
    }
}

/// An integer column of any width (`int2`, `int4`, `int8`).
fn integer(values: &[Value], at: usize, name: &str) -> Result<i64, RowError> {
    match value(values, at, name)? {
        Value::Text(b) => {
            let t = utf8(b, name)?;
            t.parse()
                .map_err(|_| RowError(format!("`{name}` = `{t}` is not an integer")))
        }
        Value::Binary(b) => match b.len() {
            2 => Ok(i64::from(i16::from_be_bytes([b[0], b[1]]))),
            4 => Ok(i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))),
            8 => Ok(i64::from_be_bytes([
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
            ])),
            n => Err(RowError(format!("`{name}` is a {n}-byte integer"))),
        },
        _ => Err(RowError(format!("`{name}` is unreadable"))),
    }
}

/// `creado_en` in epoch ms (truncated, as the polling relay reads it).
fn time_ms(values: &[Value], at: usize) -> Result<i64, RowError> {
    match value(values, at, "creado_en")? {
        Value::Text(b) => {
            let t = utf8(b, "creado_en")?;
            entrega_core::utc::parse_utc_ms(&t)
                .ok_or_else(|| RowError(format!("creado_en `{t}` is not a UTC timestamp")))
        }
        Value::Binary(b) if b.len() == 8 => {
            let micros = i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            Ok(micros.saturating_add(PG_EPOCH_MICROS).div_euclid(1_000))
        }
        _ => Err(RowError("`creado_en` is not a timestamp".into())),
    }
}

/// A `jsonb` (or `json`) column's text.
fn json(values: &[Value], at: usize, jsonb: bool, name: &str) -> Result<String, RowError> {
    match value(values, at, name)? {
        Value::Text(b) => utf8(b, name),
        Value::Binary(b) if jsonb => match b.split_first() {
            Some((1, text)) => utf8(text, name),
            _ => Err(RowError(format!("`{name}` is jsonb of an unknown version"))),
        },
        Value::Binary(b) => utf8(b, name),
        _ => Err(RowError(format!("`{name}` is unreadable"))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::wal::pgoutput::{tests as wire, Change, Decoder};

    const COLUMNS: [&str; 10] = [
        "id",
        "agregado",
        "agregado_id",
        "tipo",
        "version",
        "carga",
        "creado_en",
        "publicado_en",
        "seq",
        "headers",
    ];

    fn decoded(values: &[Option<&str>]) -> Result<Option<OutboxRow>, RowError> {
        let mut d = Decoder::new();
        let Change::Relation(relation) = d.decode(&wire::relation(3, "outbox", &COLUMNS)).unwrap()
        else {
            panic!("not a relation")
        };
        let Change::Insert { values, .. } = d.decode(&wire::insert(3, values)).unwrap() else {
            panic!("not an insert")
        };
        OutboxColumns::of(&relation).unwrap().row(&values)
    }

    #[test]
    fn a_seed_insert_becomes_the_row_the_polling_relay_reads() {
        let id = "6f1c1f0e-2d7b-4f6a-9a53-9a3f8e1b2c3d";
        let row = decoded(&[
            Some(id),
            Some("pedido"),
            Some("p-1"),
            Some("pedido.creado"),
            Some("1"),
            Some(r#"{"total": 10}"#),
            Some("2026-12-07 05:07:19.123456+00"),
            None,
            Some("42"),
            Some(r#"{"traceparent": "00-abc"}"#),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(row.id.to_string(), id);
        assert_eq!(row.aggregate_id, "p-1");
        assert_eq!(row.payload.as_str(), r#"{"total": 10}"#);
        assert_eq!(row.seq, 42);
        assert_eq!(row.created_at_ms % 1000, 123);
        assert_eq!(row.headers.get("traceparent"), Some("00-abc"));
    }

    #[test]
    fn a_row_inserted_published_is_skipped_and_bad_values_are_errors() {
        let mut values = [
            Some("6f1c1f0e-2d7b-4f6a-9a53-9a3f8e1b2c3d"),
            Some("pedido"),
            Some("p-1"),
            Some("pedido.creado"),
            Some("1"),
            Some("{}"),
            Some("2026-12-07 05:07:19+00"),
            Some("2026-12-07 05:07:20+00"),
            Some("1"),
            None,
        ];
        assert_eq!(decoded(&values), Ok(None));
        values[7] = None;
        values[4] = Some("one");
        assert!(decoded(&values).unwrap_err().0.contains("version"));
        values[4] = Some("1");
        values[0] = Some("nope");
        assert!(decoded(&values).unwrap_err().0.contains("UUID"));
    }

    #[test]
    fn binary_values_read_as_their_text_forms_do() {
        let typed = [
            ("id", 2950),
            ("agregado", 25),
            ("agregado_id", 25),
            ("tipo", 25),
            ("version", 23),
            ("carga", 3802),
            ("creado_en", 1184),
            ("publicado_en", 1184),
            ("seq", 20),
            ("headers", 3802),
        ];
        let mut d = Decoder::new();
        let Change::Relation(relation) = d
            .decode(&wire::relation_typed(4, "outbox", &typed))
            .unwrap()
        else {
            panic!("not a relation")
        };
        let id = Uuid::parse_str("6f1c1f0e-2d7b-4f6a-9a53-9a3f8e1b2c3d").unwrap();
        // 2026-12-07 05:07:19.123456 UTC in microseconds since 2000-01-01.
        let micros: i64 = 1_796_620_039_123_456 - 946_684_800_000_000;
        let jsonb = |t: &str| [&[1u8][..], t.as_bytes()].concat();
        let values = [
            Some(id.as_bytes().to_vec()),
            Some(b"pedido".to_vec()),
            Some(b"p-1".to_vec()),
            Some(b"pedido.creado".to_vec()),
            Some(2i32.to_be_bytes().to_vec()),
            Some(jsonb(r#"{"total": 10}"#)),
            Some(micros.to_be_bytes().to_vec()),
            None,
            Some(42i64.to_be_bytes().to_vec()),
            Some(jsonb(r#"{"traceparent": "00-abc"}"#)),
        ];
        let Change::Insert { values, .. } = d.decode(&wire::insert_binary(4, &values)).unwrap()
        else {
            panic!("not an insert")
        };
        let row = OutboxColumns::of(&relation)
            .unwrap()
            .row(&values)
            .unwrap()
            .unwrap();
        assert_eq!(row.id, id);
        assert_eq!((row.version, row.seq), (2, 42));
        assert_eq!(row.payload.as_str(), r#"{"total": 10}"#);
        assert_eq!(row.created_at_ms, 1_796_620_039_123);
        assert_eq!(row.headers.get("traceparent"), Some("00-abc"));
    }
}
