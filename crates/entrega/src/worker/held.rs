//! Dead letters the broker refuses: each is tried alone, and one refused for good (too
//! large, its topic missing and not creatable) or refused transiently for too long is held
//! in the consumer's database ([`HeldLetterStore`]) instead of being retried in place
//! forever, so its partition goes on and nothing is lost.

use entrega_core::{HeldId, HeldLetter, OutgoingMessage, Record, TransportError};

use super::dead_letter::publish_set_aside;
use super::Worker;

/// Deliveries a dead letter refused transiently may take, beyond the handler's own
/// attempts, before it is held rather than tried again in place.
pub(super) const TRANSIENT_TRIES: u32 = 5;

/// How one refused dead letter ended.
pub(super) enum Settled {
    /// Published after all, tried alone.
    Published,
    /// Held in the consumer's database.
    Held,
    /// Still neither: the record comes again (in place), with this error.
    Again(String),
}

/// Whether a dead letter whose publish failed with `error`, on the record's
/// `local_attempt`-th delivery here, is to be held now.
pub(super) fn holds(worker: &Worker, error: &TransportError, local_attempt: u32) -> bool {
    worker.held.is_some()
        && (!error.is_transient()
            || local_attempt >= worker.config.max_attempts.saturating_add(TRANSIENT_TRIES))
}

/// Tries each letter alone (a batch fails as a whole, though only one of its letters may be
/// refused), then holds those refused again when [`holds`] says so. `letters` pairs each
/// letter with its record and the record's delivery number here.
pub(super) async fn settle_refused(
    worker: &Worker,
    letters: Vec<(&Record, u32, OutgoingMessage)>,
) -> Vec<Settled> {
    let now_ms = worker.clock.now_ms();
    let mut settled = Vec::with_capacity(letters.len());
    let mut to_hold: Vec<(usize, HeldLetter)> = Vec::new();
    for (k, (record, local_attempt, letter)) in letters.into_iter().enumerate() {
        let alone = std::slice::from_ref(&letter);
        let sent = match &worker.side {
            Some(side) => {
                side.dead_letter(&worker.config.group, &record.topic, alone)
                    .await
            }
            None => publish_set_aside(worker, alone).await,
        };
        match sent {
            Ok(()) => settled.push(Settled::Published),
            Err(e) if holds(worker, &e, local_attempt) => {
                tracing::error!(
                    topic = %record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    destination = %letter.topic,
                    error = %e,
                    "the broker refused a dead letter; holding it in the consumer's database"
                );
                to_hold.push((k, held_letter(worker, record, letter, &e, now_ms)));
                settled.push(Settled::Held);
            }
            Err(e) => settled.push(Settled::Again(e.to_string())),
        }
    }
    let Some(store) = &worker.held else {
        return settled;
    };
    if to_hold.is_empty() {
        return settled;
    }
    let letters: Vec<HeldLetter> = to_hold.iter().map(|(_, h)| h.clone()).collect();
    if let Err(e) = store.hold(&letters).await {
        tracing::warn!(error = %e, "holding refused dead letters failed; retrying in place");
        for (k, _) in to_hold {
            if let Some(s) = settled.get_mut(k) {
                *s = Settled::Again(e.to_string());
            }
        }
    }
    settled
}

fn held_letter(
    worker: &Worker,
    record: &Record,
    letter: OutgoingMessage,
    error: &TransportError,
    now_ms: i64,
) -> HeldLetter {
    HeldLetter {
        id: HeldId {
            group: worker.config.group.clone(),
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
        },
        letter,
        refusal: entrega_core::truncate_error(&error.to_string()),
        held_at_ms: now_ms,
    }
}
