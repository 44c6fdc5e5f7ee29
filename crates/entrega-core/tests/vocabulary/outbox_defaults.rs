//! The default `OutboxReader::pending_lanes_after`, built on `pending` alone, for stores that
//! do not override it.
#![allow(clippy::unwrap_used)]

use async_trait::async_trait;
use entrega_core::{LaneCursor, LaneLease, OutboxReader, OutboxRow, RawJson, Refusal, StoreError};
use std::sync::atomic::{AtomicUsize, Ordering};
use uuid::Uuid;

/// Rows of lane `n % 2`, seq `n`; counts calls to `pending`.
struct VecReader {
    rows: Vec<(u32, OutboxRow)>,
    calls: AtomicUsize,
}

impl VecReader {
    fn new(count: i64) -> Self {
        let rows = (0..count)
            .map(|n| {
                let row = OutboxRow {
                    id: Uuid::new_v4(),
                    aggregate: "pedido".into(),
                    aggregate_id: format!("P-{n}"),
                    kind: "pedido.creado".into(),
                    version: 1,
                    payload: RawJson::null(),
                    created_at_ms: 0,
                    seq: n,
                    attempts: 0,
                    headers: Default::default(),
                };
                ((n % 2) as u32, row)
            })
            .collect();
        Self {
            rows,
            calls: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl OutboxReader for VecReader {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(self
            .rows
            .iter()
            .filter(|(l, _)| *l == lane)
            .take(limit)
            .map(|(_, r)| r.clone())
            .collect())
    }

    async fn mark_published(&self, _: &LaneLease, _: &[Uuid], _: i64) -> Result<(), StoreError> {
        Ok(())
    }

    async fn record_refusal(&self, _: &LaneLease, _: &Refusal, _: i64) -> Result<(), StoreError> {
        Ok(())
    }
}

fn seqs(found: &[entrega_core::LaneRows]) -> Vec<(u32, Vec<i64>)> {
    found
        .iter()
        .map(|f| (f.lane, f.rows.iter().map(|r| r.seq).collect()))
        .collect()
}

#[tokio::test]
async fn reads_past_a_cursor_far_into_the_lane() {
    let reader = VecReader::new(200);
    // Lane 0 holds seqs 0, 2, ..., 198; its cursor is past 80 of them.
    let cursors = [
        LaneCursor {
            lane: 1,
            after_seq: 195,
        },
        LaneCursor {
            lane: 0,
            after_seq: 158,
        },
    ];
    let found = reader.pending_lanes_after(&cursors, 3).await.unwrap();
    assert_eq!(
        seqs(&found),
        vec![(1, vec![197, 199]), (0, vec![160, 162, 164])]
    );
    // Asked for more rows, doubling, rather than one row at a time.
    assert!(reader.calls.load(Ordering::SeqCst) < 12);
}

#[tokio::test]
async fn leaves_out_lanes_with_nothing_past_the_cursor() {
    let reader = VecReader::new(10);
    let cursors = [
        LaneCursor {
            lane: 0,
            after_seq: 8,
        },
        LaneCursor {
            lane: 1,
            after_seq: i64::MIN,
        },
        LaneCursor {
            lane: 7,
            after_seq: i64::MIN,
        },
    ];
    let found = reader.pending_lanes_after(&cursors, 2).await.unwrap();
    assert_eq!(seqs(&found), vec![(1, vec![1, 3])]);
    assert!(reader
        .pending_lanes_after(&cursors, 0)
        .await
        .unwrap()
        .is_empty());
}
