//! Idempotency keys in memory, for handlers under test that must apply an effect once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use entrega_core::{Clock, SystemClock};

/// `(consumer, message id)` keys with the time they were recorded. Cheap to clone; clones
/// share the same keys.
#[derive(Debug, Clone)]
pub struct MemoryInbox {
    keys: Arc<Mutex<HashMap<(String, String), i64>>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryInbox {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryInbox {
    /// An empty inbox on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty inbox recording times from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            keys: Arc::default(),
            clock,
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<(String, String), i64>> {
        // A poisoned lock only means a test thread panicked; the data is still usable.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the key; `true` when it was new.
    pub fn claim(&self, consumer: &str, message_id: &str) -> bool {
        let now = self.clock.now_ms();
        let key = (consumer.to_owned(), message_id.to_owned());
        let mut keys = self.keys();
        if keys.contains_key(&key) {
            return false;
        }
        keys.insert(key, now);
        true
    }

    /// Whether the key is recorded, without recording it.
    pub fn contains(&self, consumer: &str, message_id: &str) -> bool {
        self.keys()
            .contains_key(&(consumer.to_owned(), message_id.to_owned()))
    }

    /// Keys recorded for `consumer`.
    pub fn count(&self, consumer: &str) -> u64 {
        self.keys().keys().filter(|(c, _)| c == consumer).count() as u64
    }

    /// Deletes keys recorded more than `age` ago; returns how many.
    pub fn purge_older_than(&self, age: Duration) -> u64 {
        let cutoff = self.clock.now_ms() - i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let mut keys = self.keys();
        let before = keys.len();
        keys.retain(|_, at| *at >= cutoff);
        (before - keys.len()) as u64
    }

    /// Moves a key's record time `age` into the past.
    pub fn backdate(&self, consumer: &str, message_id: &str, age: Duration) {
        let shift = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        if let Some(at) = self
            .keys()
            .get_mut(&(consumer.to_owned(), message_id.to_owned()))
        {
            *at = at.saturating_sub(shift);
        }
    }
}
