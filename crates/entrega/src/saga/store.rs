//! The saga tables and the statements over them: a saga's row is only ever written over the
//! version it was read at, and its history only grows.

use entrega_core::StoreError;
use serde_json::{Map, Value};

use super::record::{EventKind, HistoryEntry, Phase, SagaRecord, SagaStatus};
use crate::db::{query, query_each, Db, Query, Tx};

const COLUMNS: &str = "kind, saga_id, state, step, phase, attempts, data, results, reason, \
     next_at_ms, deadline_ms, events, version, created_at_ms, updated_at_ms, trace";

type SagaRow = (
    String,
    String,
    String,
    i32,
    String,
    i32,
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    i64,
    i64,
    i64,
    i64,
    Option<String>,
);

type HistoryRow = (
    i64,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<i32>,
    Option<String>,
);

fn corrupt(reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        table: "entrega_sagas",
        reason: reason.into(),
    }
}

fn decode(row: SagaRow) -> Result<SagaRecord, StoreError> {
    let (kind, id, status, step, phase, attempts, input, results, reason) = (
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    );
    let status =
        SagaStatus::parse(&status).ok_or_else(|| corrupt(format!("unknown state `{status}`")))?;
    let phase = Phase::parse(&phase).ok_or_else(|| corrupt(format!("unknown phase `{phase}`")))?;
    let input: Value = serde_json::from_str(&input)
        .map_err(|e| corrupt(format!("data of `{id}` are not JSON: {e}")))?;
    let results: Map<String, Value> = serde_json::from_str(&results)
        .map_err(|e| corrupt(format!("results of `{id}` are not a JSON object: {e}")))?;
    Ok(SagaRecord {
        kind,
        status,
        step: usize::try_from(step).map_err(|_| corrupt(format!("step {step}")))?,
        phase,
        attempts: u32::try_from(attempts).map_err(|_| corrupt(format!("attempts {attempts}")))?,
        input,
        results,
        reason,
        next_at_ms: row.9,
        deadline_at_ms: row.10,
        events: row.11,
        version: row.12,
        created_ms: row.13,
        updated_ms: row.14,
        trace: row.15,
        id,
    })
}

fn to_i32(n: impl TryInto<i32>) -> i32 {
    n.try_into().unwrap_or(i32::MAX)
}

/// Inserts a new saga; `false` if one of that type and id exists already.
pub(crate) async fn insert(tx: &mut Tx, rec: &SagaRecord) -> Result<bool, StoreError> {
    let q = query(format!(
        "INSERT INTO entrega_sagas ({COLUMNS}) VALUES \
         ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
         ON CONFLICT (kind, saga_id) DO NOTHING"
    ))
    .bind(rec.kind.as_str())
    .bind(rec.id.as_str())
    .bind(rec.status.as_str())
    .bind(to_i32(rec.step))
    .bind(rec.phase.as_str())
    .bind(to_i32(rec.attempts))
    .bind(rec.input.to_string())
    .bind(Value::Object(rec.results.clone()).to_string())
    .bind(&rec.reason)
    .bind(rec.next_at_ms)
    .bind(rec.deadline_at_ms)
    .bind(rec.events)
    .bind(rec.version)
    .bind(rec.created_ms)
    .bind(rec.updated_ms)
    .bind(&rec.trace);
    Ok(tx.execute(q).await? == 1)
}

/// How [`load`] treats a row another transaction holds (PostgreSQL; SQLite has one writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// Wait for it.
    Wait,
    /// Pass it by, as if it were not there.
    Skip,
}

/// The saga `kind`/`id`, locked for this transaction.
pub(crate) async fn load(
    tx: &mut Tx,
    kind: &str,
    id: &str,
    lock: Lock,
) -> Result<Option<SagaRecord>, StoreError> {
    let select = format!("SELECT {COLUMNS} FROM entrega_sagas WHERE kind = $1 AND saga_id = $2");
    let postgres = match lock {
        Lock::Wait => format!("{select} FOR UPDATE"),
        Lock::Skip => format!("{select} FOR UPDATE SKIP LOCKED"),
    };
    let q = query_each(select, postgres).bind(kind).bind(id);
    tx.fetch_optional::<SagaRow>(q)
        .await?
        .map(decode)
        .transpose()
}

/// Writes `rec` over the row at version `read_version`, as version `read_version + 1`;
/// `false` if the row is at another version now (someone else changed it).
pub(crate) async fn update(
    tx: &mut Tx,
    rec: &SagaRecord,
    read_version: i64,
) -> Result<bool, StoreError> {
    let q = query(
        "UPDATE entrega_sagas SET state = $3, step = $4, phase = $5, attempts = $6, \
         results = $7, reason = $8, next_at_ms = $9, deadline_ms = $10, events = $11, \
         version = $12, updated_at_ms = $13 \
         WHERE kind = $1 AND saga_id = $2 AND version = $14",
    )
    .bind(rec.kind.as_str())
    .bind(rec.id.as_str())
    .bind(rec.status.as_str())
    .bind(to_i32(rec.step))
    .bind(rec.phase.as_str())
    .bind(to_i32(rec.attempts))
    .bind(Value::Object(rec.results.clone()).to_string())
    .bind(&rec.reason)
    .bind(rec.next_at_ms)
    .bind(rec.deadline_at_ms)
    .bind(rec.events)
    .bind(read_version.saturating_add(1))
    .bind(rec.updated_ms)
    .bind(read_version);
    Ok(tx.execute(q).await? == 1)
}

/// Appends `entries` to the history of `kind`/`id`.
pub(crate) async fn append(
    tx: &mut Tx,
    kind: &str,
    id: &str,
    entries: &[HistoryEntry],
) -> Result<(), StoreError> {
    for e in entries {
        let q = query(
            "INSERT INTO entrega_saga_history \
             (kind, saga_id, n, at_ms, what, step, phase, msg_key, attempt, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(kind)
        .bind(id)
        .bind(e.n)
        .bind(e.at_ms)
        .bind(e.what.as_str())
        .bind(e.step.as_str())
        .bind(e.phase.as_str())
        .bind(&e.key)
        .bind(e.attempt.map(to_i32))
        .bind(&e.detail);
        tx.execute(q).await?;
    }
    Ok(())
}

/// Ids of sagas of `kind` whose timer is due at `now_ms`, soonest first, at most `limit`.
pub(crate) async fn due(
    db: &Db,
    kind: &str,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    let q = query(
        "SELECT saga_id FROM entrega_sagas WHERE kind = $1 AND next_at_ms IS NOT NULL \
         AND next_at_ms <= $2 ORDER BY next_at_ms LIMIT $3",
    )
    .bind(kind)
    .bind(now_ms)
    .bind(limit);
    let rows: Vec<(String,)> = db.fetch_all(q).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// When the soonest timer of `kind` fires, if any is set.
pub(crate) async fn next_due(db: &Db, kind: &str) -> Result<Option<i64>, StoreError> {
    let q = query("SELECT MIN(next_at_ms) FROM entrega_sagas WHERE kind = $1").bind(kind);
    Ok(db.scalar::<Option<i64>>(q).await?.flatten())
}

/// Sagas of `kind`, newest first, in `status` if given, at most `limit`.
pub(crate) async fn list(
    db: &Db,
    kind: &str,
    status: Option<SagaStatus>,
    offset: i64,
    limit: i64,
) -> Result<Vec<SagaRecord>, StoreError> {
    let q: Query = match status {
        Some(status) => query(format!(
            "SELECT {COLUMNS} FROM entrega_sagas WHERE kind = $1 AND state = $2 \
             ORDER BY created_at_ms DESC, saga_id LIMIT $3 OFFSET $4"
        ))
        .bind(kind)
        .bind(status.as_str())
        .bind(limit)
        .bind(offset),
        None => query(format!(
            "SELECT {COLUMNS} FROM entrega_sagas WHERE kind = $1 \
             ORDER BY created_at_ms DESC, saga_id LIMIT $2 OFFSET $3"
        ))
        .bind(kind)
        .bind(limit)
        .bind(offset),
    };
    let rows: Vec<SagaRow> = db.fetch_all(q).await?;
    rows.into_iter().map(decode).collect()
}

/// The saga `kind`/`id`, unlocked.
pub(crate) async fn get(db: &Db, kind: &str, id: &str) -> Result<Option<SagaRecord>, StoreError> {
    let q = query(format!(
        "SELECT {COLUMNS} FROM entrega_sagas WHERE kind = $1 AND saga_id = $2"
    ))
    .bind(kind)
    .bind(id);
    db.fetch_optional::<SagaRow>(q)
        .await?
        .map(decode)
        .transpose()
}

/// The history of `kind`/`id`, oldest first.
pub(crate) async fn history(
    db: &Db,
    kind: &str,
    id: &str,
) -> Result<Vec<HistoryEntry>, StoreError> {
    let q = query(
        "SELECT n, at_ms, what, step, phase, msg_key, attempt, detail FROM entrega_saga_history \
         WHERE kind = $1 AND saga_id = $2 ORDER BY n",
    )
    .bind(kind)
    .bind(id);
    let rows: Vec<HistoryRow> = db.fetch_all(q).await?;
    rows.into_iter()
        .map(|(n, at_ms, what, step, phase, key, attempt, detail)| {
            Ok(HistoryEntry {
                n,
                at_ms,
                what: EventKind::parse(&what).ok_or_else(|| corrupt(format!("what `{what}`")))?,
                step,
                phase: Phase::parse(&phase).ok_or_else(|| corrupt(format!("phase `{phase}`")))?,
                key,
                attempt: attempt.and_then(|a| u32::try_from(a).ok()),
                detail,
            })
        })
        .collect()
}

/// How many sagas of `kind` are in each status.
pub(crate) async fn counts(db: &Db, kind: &str) -> Result<Vec<(SagaStatus, i64)>, StoreError> {
    let q = query("SELECT state, COUNT(*) FROM entrega_sagas WHERE kind = $1 GROUP BY state")
        .bind(kind);
    let rows: Vec<(String, i64)> = db.fetch_all(q).await?;
    rows.into_iter()
        .map(|(status, n)| {
            let status = SagaStatus::parse(&status)
                .ok_or_else(|| corrupt(format!("unknown state `{status}`")))?;
            Ok((status, n))
        })
        .collect()
}
