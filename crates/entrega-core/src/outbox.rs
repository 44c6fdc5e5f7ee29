//! The outbox seams the relay works through: lanes with leases, pending rows, maintenance.
//!
//! Rows are spread over [`LANES`] lanes by a stable hash of `agregado_id`. A relay instance
//! publishes a lane only while it holds the lane's lease, in insertion order, so the events of
//! one aggregate keep their order however many relays run. Pending rows are found by
//! `publicado_en IS NULL`, never by a high-water mark, so a row whose transaction commits late
//! is published too.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use crate::{BlockedRow, Envelope, Headers, Holder, RawJson, Refusal, ReleaseError, StoreError};

/// Number of relay lanes. Fixed by the schema (the Postgres lane is a generated column).
pub const LANES: u32 = 64;

/// The lane of an aggregate on backends that compute it in Rust.
pub fn lane_of(aggregate_id: &str) -> u32 {
    (crate::partition::murmur2(aggregate_id.as_bytes()) as u32) % LANES
}

/// An event waiting in the outbox (the seed's columns plus bookkeeping).
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    /// Row id; becomes the envelope's `id_evento`.
    pub id: Uuid,
    /// Aggregate type (`agregado`), e.g. `pedido`; selects the topic.
    pub aggregate: String,
    /// Aggregate id (`agregado_id`); the partition key.
    pub aggregate_id: String,
    /// Event type (`tipo`).
    pub kind: String,
    /// Schema version (`version`).
    pub version: u32,
    /// Payload (`carga`), the envelope's `datos`, as the store returned its text.
    pub payload: RawJson,
    /// Creation time (`creado_en`) in epoch ms; the envelope's `fecha_ms`.
    pub created_at_ms: i64,
    /// Insertion sequence; publishing order within a lane.
    pub seq: i64,
    /// Publishing attempts the transport refused so far (`attempts`); 0 for a fresh row.
    pub attempts: u32,
    /// Headers to publish with the event (`headers`), e.g. its `traceparent`; empty for
    /// rows written without any.
    pub headers: Headers,
}

impl OutboxRow {
    /// The envelope this row is published as.
    pub fn envelope(&self, source: &str) -> Envelope {
        Envelope {
            id: self.id,
            kind: self.kind.clone(),
            version: self.version,
            timestamp_ms: self.created_at_ms,
            source: source.to_owned(),
            data: self.payload.to_value(),
        }
    }

    /// The wire form of [`OutboxRow::envelope`], serialized straight from the row: the payload's
    /// text is written as stored, never parsed. The same JSON value as
    /// `self.envelope(source).to_bytes()` (and the same bytes when the stored text is compact
    /// with sorted keys).
    pub fn envelope_bytes(&self, source: &str) -> Vec<u8> {
        let wire = WireEnvelope {
            id_evento: &self.id,
            tipo: &self.kind,
            version: self.version,
            fecha_ms: self.created_at_ms,
            origen: source,
            datos: &self.payload,
        };
        // Plain strings, numbers and validated JSON text: serializing cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }
}

/// [`Envelope`]'s wire fields, borrowed, in the same order.
#[derive(serde::Serialize)]
struct WireEnvelope<'a> {
    id_evento: &'a Uuid,
    tipo: &'a str,
    version: u32,
    fecha_ms: i64,
    origen: &'a str,
    datos: &'a RawJson,
}

/// A new event to enqueue in the caller's transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Event id; `id_evento`. Generate once and reuse on retries.
    pub id: Uuid,
    /// Aggregate type (`agregado`).
    pub aggregate: String,
    /// Aggregate id (`agregado_id`).
    pub aggregate_id: String,
    /// Event type (`tipo`).
    pub kind: String,
    /// Schema version, at least 1.
    pub version: u32,
    /// Payload (`carga`).
    pub payload: Value,
    /// Headers the relay publishes with the event (`headers`). The transaction's trace
    /// context is added as `traceparent` when the event is enqueued inside one
    /// (`entrega::trace::scope`) and carries none of its own.
    pub headers: Headers,
}

impl NewEvent {
    /// A version-1 event with a fresh id.
    pub fn new(
        aggregate: impl Into<String>,
        aggregate_id: impl Into<String>,
        kind: impl Into<String>,
        payload: Value,
    ) -> Self {
        Self {
            id: Uuid::new_v4(),
            aggregate: aggregate.into(),
            aggregate_id: aggregate_id.into(),
            kind: kind.into(),
            version: 1,
            payload,
            headers: Headers::new(),
        }
    }

    /// Builder: sets a header to publish with the event.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.set(name, value);
        self
    }
}

/// A lane held by one relay instance until `expires_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneLease {
    /// The lane.
    pub lane: u32,
    /// The holder.
    pub owner: String,
    /// Fencing token: grows every time the lane changes hands.
    pub token: i64,
    /// Expiry in epoch ms.
    pub expires_at_ms: i64,
}

/// Lane ownership among relay instances.
#[async_trait]
pub trait LaneLeases: Send + Sync {
    /// Heartbeats `owner`, renews its leases, takes its earlier incarnation's lanes and free or
    /// expired ones up to its fair share (lanes / live instances, rounded up) and gives back any
    /// surplus ([`crate::plan_balance`]). Returns the lanes held: none once a later incarnation
    /// of the same name holds lanes.
    async fn balance(
        &self,
        owner: &Holder,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<Vec<LaneLease>, StoreError>;

    /// Gives back every lane this incarnation of `owner` holds and forgets the instance
    /// (clean shutdown).
    async fn release_all(&self, owner: &Holder) -> Result<(), StoreError>;
}

/// The pending rows of one lane, oldest first, as [`OutboxReader::pending_lanes`] returns them.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneRows {
    /// The lane.
    pub lane: u32,
    /// Its oldest unpublished rows, in insertion order.
    pub rows: Vec<OutboxRow>,
}

/// Where to go on reading a lane: only its rows after `after_seq`
/// ([`OutboxReader::pending_lanes_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCursor {
    /// The lane.
    pub lane: u32,
    /// The `seq` of the last row already taken from the lane; rows up to it are skipped.
    pub after_seq: i64,
}

/// Rows of one lane to mark published under that lane's lease
/// ([`OutboxReader::mark_published_lanes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneMark {
    /// The lease the rows were read and published under.
    pub lease: LaneLease,
    /// The rows' ids.
    pub ids: Vec<Uuid>,
}

/// Reading and marking pending rows.
///
/// Every pending read leaves out the rows of an aggregate from its earliest blocked row on:
/// a row the transport refused waits for its next attempt (`next_attempt_at` still in the
/// future, by the store's clock) or, held, for an operator, and the aggregate's later rows
/// wait behind it. Rows of the lane's other aggregates are read as usual.
#[async_trait]
pub trait OutboxReader: Send + Sync {
    /// Up to `limit` unpublished rows of `lane`, oldest first, without the rows of blocked
    /// aggregates.
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError>;

    /// Marks rows published at `now_ms`, but only while `lease` is still held: otherwise
    /// nothing changes and [`StoreError::LeaseLost`] is returned.
    async fn mark_published(
        &self,
        lease: &LaneLease,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// Records that the transport refused the pending row `refusal.id` of `lease`'s lane:
    /// `attempts + 1`, the last error, and the next attempt time or, when
    /// [`Refusal::retry_at_ms`] is `None`, the holding time `now_ms`. Only while `lease` is
    /// still held, as [`OutboxReader::mark_published`]: otherwise nothing changes and
    /// [`StoreError::LeaseLost`] is returned. A row that is no longer pending, or not in the
    /// lane, is left alone.
    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// Up to `limit` unpublished rows of each of `lanes`, oldest first within a lane, read
    /// at once where the backend can (one query instead of one per lane). Lanes without
    /// pending rows are left out; the others come in the order of `lanes`.
    ///
    /// The default asks [`OutboxReader::pending`] lane by lane.
    async fn pending_lanes(
        &self,
        lanes: &[u32],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let mut found = Vec::new();
        for &lane in lanes {
            let rows = self.pending(lane, limit).await?;
            if !rows.is_empty() {
                found.push(LaneRows { lane, rows });
            }
        }
        Ok(found)
    }

    /// Like [`OutboxReader::pending_lanes`], but only the rows of each lane after its cursor:
    /// the relay reads a lane's next rows while the rows up to the cursor are still being
    /// published, and so still pending. Lanes without such rows are left out; the others come
    /// in the order of `cursors`.
    ///
    /// The default reads each lane with [`OutboxReader::pending`], asking for more rows until
    /// `limit` rows past the cursor are found or the lane has no more.
    async fn pending_lanes_after(
        &self,
        cursors: &[LaneCursor],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        for cursor in cursors {
            let mut ask = limit.saturating_mul(2);
            loop {
                let rows = self.pending(cursor.lane, ask).await?;
                let exhausted = rows.len() < ask || ask == usize::MAX;
                let after: Vec<OutboxRow> = rows
                    .into_iter()
                    .filter(|r| r.seq > cursor.after_seq)
                    .take(limit)
                    .collect();
                if after.len() == limit || exhausted {
                    if !after.is_empty() {
                        found.push(LaneRows {
                            lane: cursor.lane,
                            rows: after,
                        });
                    }
                    break;
                }
                ask = ask.saturating_mul(2);
            }
        }
        Ok(found)
    }

    /// Marks the rows of several lanes published at `now_ms`, each lane only while its own
    /// lease is still held, written at once where the backend can. Returns the lanes whose
    /// lease was lost: their rows are left unmarked, the other lanes' rows are marked.
    ///
    /// The default calls [`OutboxReader::mark_published`] lane by lane.
    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        let mut lost = Vec::new();
        for mark in marks {
            match self.mark_published(&mark.lease, &mark.ids, now_ms).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost { .. }) => lost.push(mark.lease.lane),
                Err(e) => return Err(e),
            }
        }
        Ok(lost)
    }
}

/// Backlog figures for operators.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutboxStatus {
    /// Rows not yet published.
    pub pending: u64,
    /// Age of the oldest pending row, in ms (0 when none).
    pub oldest_pending_age_ms: i64,
    /// Published rows still kept (awaiting purge).
    pub published: u64,
    /// Pending rows the transport refused that wait for their next attempt.
    pub retrying: u64,
    /// Pending rows the transport refused that are held until an operator releases them.
    pub held: u64,
    /// The refused rows (retrying and held), oldest first, at most
    /// [`crate::BLOCKED_ROWS_LISTED`] of them.
    pub blocked: Vec<BlockedRow>,
}

/// Purging and reporting.
#[async_trait]
pub trait OutboxMaintenance: Send + Sync {
    /// Deletes rows published before `before_ms`; returns how many.
    async fn purge_published(&self, before_ms: i64) -> Result<u64, StoreError>;

    /// Current backlog, with the rows the transport refused.
    async fn status(&self, now_ms: i64) -> Result<OutboxStatus, StoreError>;

    /// Releases the held row `id`: clears `held_at` and `next_attempt_at` so the relay
    /// tries it again at once, ahead of its aggregate's later rows. `attempts` and
    /// `last_error` are kept as its history; a released row the transport refuses again is
    /// held again. Fails, changing nothing, with [`ReleaseError::UnknownRow`] or
    /// [`ReleaseError::NotHeld`].
    async fn release(&self, id: Uuid) -> Result<(), ReleaseError>;
}

/// Wakes the relay when new rows may have been committed.
#[async_trait]
pub trait OutboxWakeup: Send + Sync {
    /// Returns when a commit was signalled or `timeout` passed, whichever is first.
    async fn wait(&self, timeout: Duration);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn envelope_bytes_equal_the_envelope_serialized() {
        let row = OutboxRow {
            id: Uuid::new_v4(),
            aggregate: "pedido".into(),
            aggregate_id: "P-1".into(),
            kind: "pedido.creado".into(),
            version: 2,
            payload: serde_json::json!({
                "id": "P-1", "cliente": "ana \"la\" ñ", "lineas": [{"producto": "queso", "cantidad": 2}],
                "nulo": null, "f": 1.5
            })
            .into(),
            created_at_ms: 1_764_500_000_123,
            seq: 7,
            attempts: 0,
            headers: Headers::new(),
        };
        let bytes = row.envelope_bytes("pedidos");
        assert_eq!(bytes, row.envelope("pedidos").to_bytes());
        let parsed = Envelope::parse_with(&bytes, &crate::Limits::default()).unwrap();
        assert_eq!(parsed, row.envelope("pedidos"));
    }

    #[test]
    fn envelope_bytes_carry_the_stored_text_of_the_payload() {
        // PostgreSQL's jsonb text: spaces after separators, keys by length then bytes.
        let stored = r#"{"id": "P-2", "lineas": [{"cantidad": 1, "producto": "pan"}]}"#;
        let row = OutboxRow {
            id: Uuid::new_v4(),
            aggregate: "pedido".into(),
            aggregate_id: "P-2".into(),
            kind: "pedido.creado".into(),
            version: 1,
            payload: RawJson::parse(stored.to_owned()).unwrap(),
            created_at_ms: 1_764_500_000_456,
            seq: 8,
            attempts: 0,
            headers: Headers::new(),
        };
        let bytes = row.envelope_bytes("pedidos");
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains(&format!("\"datos\":{stored}")), "{text}");
        let parsed = Envelope::parse_with(&bytes, &crate::Limits::default()).unwrap();
        assert_eq!(parsed, row.envelope("pedidos"));
        assert_eq!(parsed.data["lineas"][0]["producto"], "pan");
    }
}
