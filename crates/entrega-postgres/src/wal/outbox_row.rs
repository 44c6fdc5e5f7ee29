//! An outbox row from an inserted tuple of the replication stream: the same [`OutboxRow`] the
//! polling relay reads with SQL, built from the columns' text output.

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
        })
    }

    /// The row an insert carries; `None` for a row inserted already published (nothing to
    /// do, as for the polling relay).
    pub fn row(&self, values: &[Value]) -> Result<Option<OutboxRow>, RowError> {
        if !matches!(values.get(self.published_at), Some(Value::Null)) {
            return Ok(None);
        }
        let text = |at: usize, name: &str| -> Result<&str, RowError> {
            match values.get(at) {
                Some(Value::Text(bytes)) => std::str::from_utf8(bytes)
                    .map_err(|_| RowError(format!("`{name}` is not UTF-8"))),
                Some(Value::Null) => Err(RowError(format!("`{name}` is NULL"))),
                _ => Err(RowError(format!("`{name}` is not in text form"))),
            }
        };
        let id_text = text(self.id, "id")?;
        let id = Uuid::parse_str(id_text)
            .map_err(|e| RowError(format!("id `{id_text}` is not a UUID: {e}")))?;
        let number = |at: usize, name: &str| -> Result<i64, RowError> {
            let t = text(at, name)?;
            t.parse::<i64>()
                .map_err(|_| RowError(format!("row {id}: `{name}` = `{t}` is not an integer")))
        };
        let version = u32::try_from(number(self.version, "version")?)
            .map_err(|_| RowError(format!("row {id}: version out of range")))?;
        let created = text(self.created_at, "creado_en")?;
        let created_at_ms = entrega_core::utc::parse_utc_ms(created).ok_or_else(|| {
            RowError(format!(
                "row {id}: creado_en `{created}` is not a UTC timestamp"
            ))
        })?;
        let payload = RawJson::parse(text(self.payload, "carga")?.to_owned())
            .map_err(|e| RowError(format!("row {id}: carga is not JSON: {e}")))?;
        let headers = match self.headers.and_then(|at| values.get(at)) {
            Some(Value::Text(bytes)) => Headers::from_json_object(&String::from_utf8_lossy(bytes)),
            _ => Headers::new(),
        };
        Ok(Some(OutboxRow {
            id,
            aggregate: text(self.aggregate, "agregado")?.to_owned(),
            aggregate_id: text(self.aggregate_id, "agregado_id")?.to_owned(),
            kind: text(self.kind, "tipo")?.to_owned(),
            version,
            payload,
            created_at_ms,
            seq: number(self.seq, "seq")?,
            attempts: 0,
            headers,
        }))
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
}
