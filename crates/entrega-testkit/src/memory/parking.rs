//! [`ParkingStore`] in memory, with the same rules as the database backends.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use entrega_core::{ParkedAt, ParkedRecord, ParkingStore, StoreError};

type Slot = (String, String, u32);

/// Parked records per (group, topic, partition), by offset.
#[derive(Debug, Default)]
pub struct MemoryParking {
    rows: Mutex<BTreeMap<Slot, BTreeMap<i64, ParkedRecord>>>,
}

impl MemoryParking {
    /// Empty parking.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<Slot, BTreeMap<i64, ParkedRecord>>) -> T) -> T {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rows)
    }
}

fn slot(at: ParkedAt<'_>) -> Slot {
    (at.group.to_owned(), at.topic.to_owned(), at.partition)
}

#[async_trait]
impl ParkingStore for MemoryParking {
    async fn park(&self, records: &[ParkedRecord]) -> Result<(), StoreError> {
        self.with(|rows| {
            for r in records {
                rows.entry((r.group.clone(), r.topic.clone(), r.partition))
                    .or_default()
                    .entry(r.offset)
                    .or_insert_with(|| r.clone());
            }
        });
        Ok(())
    }

    async fn parked_keys(&self, at: ParkedAt<'_>) -> Result<Vec<Option<String>>, StoreError> {
        Ok(self.with(|rows| {
            let mut keys: Vec<Option<String>> = rows
                .get(&slot(at))
                .map(|p| p.values().map(|r| r.key.clone()).collect())
                .unwrap_or_default();
            keys.sort();
            keys.dedup();
            keys
        }))
    }

    async fn head(
        &self,
        at: ParkedAt<'_>,
        key: Option<&str>,
    ) -> Result<Option<ParkedRecord>, StoreError> {
        Ok(self.with(|rows| {
            rows.get(&slot(at))
                .and_then(|p| p.values().find(|r| r.key.as_deref() == key).cloned())
        }))
    }

    async fn reschedule(
        &self,
        at: ParkedAt<'_>,
        offset: i64,
        attempts: u32,
        not_before_ms: i64,
        last_error: &str,
    ) -> Result<(), StoreError> {
        self.with(|rows| {
            if let Some(r) = rows.get_mut(&slot(at)).and_then(|p| p.get_mut(&offset)) {
                r.attempts = attempts;
                r.not_before_ms = not_before_ms;
                r.last_error = Some(last_error.to_owned());
            }
        });
        Ok(())
    }

    async fn remove(&self, at: ParkedAt<'_>, offset: i64) -> Result<(), StoreError> {
        self.with(|rows| {
            if let Some(p) = rows.get_mut(&slot(at)) {
                p.remove(&offset);
            }
        });
        Ok(())
    }

    async fn list(
        &self,
        group: &str,
        topic: &str,
        limit: usize,
    ) -> Result<Vec<ParkedRecord>, StoreError> {
        Ok(self.with(|rows| {
            rows.iter()
                .filter(|((g, t, _), _)| g == group && t == topic)
                .flat_map(|(_, p)| p.values().cloned())
                .take(limit)
                .collect()
        }))
    }
}
