//! Operator actions: replaying dead letters to their origin topic and discarding them.
//!
//! A replay publishes the original key and payload again, in dead-letter offset order (so in
//! origin order per key: one key's dead letters share a partition), with the dead letter's
//! own headers minus the dead-letter ones (`intentos`, `motivo`, origin), `entrega-replays`
//! one higher, and `entrega-only-group` when aimed at one group. Only after the publish is
//! confirmed are the dead letters marked replayed; a crash in between leaves them pending,
//! and replaying them again is absorbed by idempotent consumers.

use std::collections::HashSet;

use entrega_core::headers::{
    former, CLASS, CODE, INTENTOS, MOTIVO, ONLY_GROUP, ONLY_GROUP_SIGNATURE, ORIGIN_GROUP,
    ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC, REPLAYS,
};
use entrega_core::{
    DeadLetterMark, DeadLetterState, DlqAction, DlqAuditEntry, OutgoingMessage, ReplayKey,
};
use serde::Serialize;

use super::error::DlqError;
use super::filter::DlqFilter;
use super::letter::DeadLetter;
use super::DeadLetters;

/// Default of [`ReplayOptions::max_replays`].
pub const DEFAULT_MAX_REPLAYS: u32 = 3;

/// How to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Who replays (for the state and the audit).
    pub operator: String,
    /// Report what would happen; publish and mark nothing (the dry run is audited).
    pub dry_run: bool,
    /// A dead letter already replayed this many times is refused.
    pub max_replays: u32,
    /// Deliver to this consumer group only (header `entrega-only-group`).
    pub group: Option<String>,
    /// Act only if exactly this many pending dead letters match (what a dry run showed the
    /// operator); otherwise refuse with [`DlqError::SelectionChanged`] and do nothing.
    pub expect_matched: Option<usize>,
    /// Act only if the pending dead letters that match are the very ones a dry run showed
    /// ([`ActionReport::selection`]); otherwise refuse with
    /// [`DlqError::SelectionReplaced`] and do nothing.
    pub expect_selection: Option<String>,
}

impl ReplayOptions {
    /// A real replay by `operator` to every group, with the default limit.
    pub fn new(operator: impl Into<String>) -> Self {
        Self {
            operator: operator.into(),
            dry_run: false,
            max_replays: DEFAULT_MAX_REPLAYS,
            group: None,
            expect_matched: None,
            expect_selection: None,
        }
    }
}

/// How to discard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscardOptions {
    /// Who discards.
    pub operator: String,
    /// Why; required.
    pub reason: String,
    /// Report what would happen; mark nothing (the dry run is audited).
    pub dry_run: bool,
    /// Act only if exactly this many pending dead letters match; see
    /// [`ReplayOptions::expect_matched`].
    pub expect_matched: Option<usize>,
    /// Act only if the very dead letters a dry run showed match; see
    /// [`ReplayOptions::expect_selection`].
    pub expect_selection: Option<String>,
}

impl DiscardOptions {
    /// The reason, trimmed; a discard without one is refused.
    pub(super) fn checked_reason(&self) -> Result<&str, DlqError> {
        let reason = self.reason.trim();
        if reason.is_empty() {
            return Err(DlqError::ReasonRequired);
        }
        Ok(reason)
    }

    /// A real discard by `operator` for `reason`.
    pub fn new(operator: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            operator: operator.into(),
            reason: reason.into(),
            dry_run: false,
            expect_matched: None,
            expect_selection: None,
        }
    }
}

/// One dead letter an action applied to (or would have, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The dead letter.
    pub id: String,
    /// Where it went (replays) or its topic (discards).
    pub topic: String,
    /// Its key.
    pub key: Option<String>,
    /// The replay count it was published with (`entrega-replays`); 0 for discards.
    pub replays: u32,
}

/// One dead letter an action refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refused {
    /// The dead letter.
    pub id: String,
    /// Its key.
    pub key: Option<String>,
    /// Why.
    pub reason: String,
}

/// What a replay or discard did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionReport {
    /// `replay` or `discard`.
    #[serde(serialize_with = "action_name")]
    pub action: DlqAction,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Pending dead letters the selection matched.
    pub matched: usize,
    /// Names exactly those dead letters ([`selection_token`]): a confirmation sends it back
    /// (`expect_selection`) so it acts on what the operator saw, or on nothing.
    pub selection: String,
    /// Those published again or discarded (or that would be).
    pub applied: Vec<Applied>,
    /// Those refused, with why.
    pub refused: Vec<Refused>,
}

impl DeadLetters {
    /// Replays the selected pending dead letters; see the module docs. Refused (and so left
    /// pending): a dead letter already replayed `max_replays` times, and every later one of
    /// the same key and dead-letter topic, so a key's order is never broken.
    pub async fn replay(
        &self,
        filter: &DlqFilter,
        options: &ReplayOptions,
    ) -> Result<ActionReport, DlqError> {
        if options.max_replays == 0 {
            return Err(DlqError::ZeroReplayLimit);
        }
        let signer = match (&options.group, &self.replay_key) {
            (Some(group), Some(key)) => Some((group.as_str(), key)),
            (Some(_), None) => return Err(DlqError::NoReplayKey),
            (None, _) => None,
        };
        self.exclusively(
            options.dry_run,
            self.replay_selected(filter, options, signer),
        )
        .await
    }

    /// [`DeadLetters::replay`] once the action lock is held.
    async fn replay_selected(
        &self,
        filter: &DlqFilter,
        options: &ReplayOptions,
        signer: Option<(&str, &ReplayKey)>,
    ) -> Result<ActionReport, DlqError> {
        let selected = self.select_pending(filter).await?;
        let selection = confirmed_selection(
            selected.iter().map(|l| l.id.to_string()),
            options.expect_matched,
            options.expect_selection.as_deref(),
        )?;
        let mut held = HeldKeys::default();
        let mut report = ActionReport {
            action: DlqAction::Replay,
            dry_run: options.dry_run,
            matched: selected.len(),
            selection,
            applied: Vec::new(),
            refused: Vec::new(),
        };
        let mut batch = Vec::new();
        let mut replayed = Vec::new();
        for letter in &selected {
            if let Some(refused) = held.refuse(letter, options.max_replays) {
                report.refused.push(refused);
                continue;
            }
            let message = replay_message(letter, signer);
            report.applied.push(Applied {
                id: letter.id.to_string(),
                topic: message.topic.clone(),
                key: letter.key.clone(),
                replays: letter.replays + 1,
            });
            replayed.push((letter.id.clone(), letter.replays + 1));
            batch.push(message);
        }
        if !options.dry_run && !batch.is_empty() {
            self.publisher.publish(&batch).await?;
        }
        let at_ms = self.clock.now_ms();
        let marks: Vec<DeadLetterMark> = if options.dry_run {
            Vec::new()
        } else {
            replayed
                .into_iter()
                .map(|(id, replays)| DeadLetterMark {
                    id,
                    state: DeadLetterState::Replayed,
                    at_ms,
                    operator: options.operator.clone(),
                    reason: None,
                    replays,
                })
                .collect()
        };
        let mut detail = format!("max replays {}", options.max_replays);
        if let Some(group) = &options.group {
            detail.push_str(&format!("; only group {group}"));
        }
        let entry = audit_entry(&report, filter, &options.operator, at_ms, Some(detail));
        self.store.record(&entry, &marks).await?;
        Ok(report)
    }

    /// Discards the selected pending dead letters for `options.reason`.
    pub async fn discard(
        &self,
        filter: &DlqFilter,
        options: &DiscardOptions,
    ) -> Result<ActionReport, DlqError> {
        let reason = options.checked_reason()?;
        self.exclusively(
            options.dry_run,
            self.discard_selected(filter, options, reason),
        )
        .await
    }

    /// [`DeadLetters::discard`] once the action lock is held.
    async fn discard_selected(
        &self,
        filter: &DlqFilter,
        options: &DiscardOptions,
        reason: &str,
    ) -> Result<ActionReport, DlqError> {
        let selected = self.select_pending(filter).await?;
        let selection = confirmed_selection(
            selected.iter().map(|l| l.id.to_string()),
            options.expect_matched,
            options.expect_selection.as_deref(),
        )?;
        let at_ms = self.clock.now_ms();
        let report = ActionReport {
            action: DlqAction::Discard,
            dry_run: options.dry_run,
            matched: selected.len(),
            selection,
            applied: selected
                .iter()
                .map(|l| Applied {
                    id: l.id.to_string(),
                    topic: l.id.topic.clone(),
                    key: l.key.clone(),
                    replays: 0,
                })
                .collect(),
            refused: Vec::new(),
        };
        let marks: Vec<DeadLetterMark> = if options.dry_run {
            Vec::new()
        } else {
            selected
                .iter()
                .map(|l| DeadLetterMark {
                    id: l.id.clone(),
                    state: DeadLetterState::Discarded,
                    at_ms,
                    operator: options.operator.clone(),
                    reason: Some(reason.to_owned()),
                    replays: l.replays,
                })
                .collect()
        };
        let entry = audit_entry(
            &report,
            filter,
            &options.operator,
            at_ms,
            Some(reason.to_owned()),
        );
        self.store.record(&entry, &marks).await?;
        Ok(report)
    }

    /// The pending dead letters `filter` selects, in topic, partition and offset order. An id
    /// that names nothing, or a dead letter already acted on, is an error.
    async fn select_pending(&self, filter: &DlqFilter) -> Result<Vec<DeadLetter>, DlqError> {
        let letters = self.read(filter).await?;
        for id in &filter.ids {
            if let Some(letter) = letters.iter().find(|l| l.id == *id) {
                if let Some(mark) = &letter.mark {
                    return Err(DlqError::NotPending {
                        id: id.clone(),
                        state: mark.state.as_str(),
                    });
                }
            }
        }
        Ok(letters.into_iter().filter(DeadLetter::is_pending).collect())
    }
}

/// The token of the selection `names` (in order), refused unless it is what the operator
/// confirmed: `expected` letters named by `expected_selection`, each when given.
pub(super) fn confirmed_selection(
    names: impl ExactSizeIterator<Item = String>,
    expected: Option<usize>,
    expected_selection: Option<&str>,
) -> Result<String, DlqError> {
    let matched = names.len();
    let selection = selection_token(names);
    DlqError::check_confirmed(expected, expected_selection, &selection, matched)?;
    Ok(selection)
}

/// A token naming a selection of dead letters by their ids, in the order given: the first
/// 16 bytes of their SHA-256, in hex. Two selections of the same size but other letters have
/// other tokens.
pub fn selection_token(ids: impl Iterator<Item = String>) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    for id in ids {
        hasher.update(id.as_bytes());
        hasher.update(b"\n");
    }
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The message a replay publishes for `letter`.
fn replay_message(letter: &DeadLetter, signer: Option<(&str, &ReplayKey)>) -> OutgoingMessage {
    let mut headers = letter.headers.clone();
    let dead_letter_only = [
        INTENTOS,
        MOTIVO,
        CLASS,
        CODE,
        ORIGIN_TOPIC,
        ORIGIN_PARTITION,
        ORIGIN_OFFSET,
        ORIGIN_GROUP,
        REPLAYS,
        ONLY_GROUP,
        ONLY_GROUP_SIGNATURE,
    ];
    headers = headers
        .iter()
        .filter(|(name, _)| {
            !dead_letter_only
                .iter()
                .any(|h| h == name || former::before(h) == Some(*name))
        })
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    headers.set(REPLAYS, (letter.replays + 1).to_string());
    let mut message = OutgoingMessage {
        topic: letter.origin.topic.clone(),
        key: letter.key.clone(),
        headers,
        payload: letter.payload.clone(),
    };
    if let Some((group, key)) = signer {
        key.stamp(&mut message, group);
    }
    message
}

/// Keys a replay refused a dead letter of: their later dead letters are refused too, so a
/// key's order is never broken.
#[derive(Debug, Default)]
pub(super) struct HeldKeys(HashSet<(String, String)>);

impl HeldKeys {
    /// Whether `letter` is refused, and why: replayed `max_replays` times already, or behind
    /// a refused one of its key. A refused letter holds its key.
    pub(super) fn refuse(&mut self, letter: &DeadLetter, max_replays: u32) -> Option<Refused> {
        let key = letter.key.clone().map(|k| (letter.id.topic.clone(), k));
        let reason = if letter.replays >= max_replays {
            format!(
                "replayed {} times already (limit {max_replays}): discard it or fix the cause",
                letter.replays
            )
        } else if key.as_ref().is_some_and(|k| self.0.contains(k)) {
            "held: an earlier dead letter of its key was refused".to_owned()
        } else {
            return None;
        };
        if let Some(k) = key {
            self.0.insert(k);
        }
        Some(Refused {
            id: letter.id.to_string(),
            key: letter.key.clone(),
            reason,
        })
    }
}

pub(super) fn audit_entry(
    report: &ActionReport,
    filter: &DlqFilter,
    operator: &str,
    at_ms: i64,
    detail: Option<String>,
) -> DlqAuditEntry {
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    DlqAuditEntry {
        at_ms,
        operator: operator.to_owned(),
        action: report.action,
        filter: filter.describe(),
        dry_run: report.dry_run,
        matched: count(report.matched),
        applied: count(report.applied.len()),
        refused: count(report.refused.len()),
        detail,
    }
}

fn action_name<S: serde::Serializer>(action: &DlqAction, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(action.as_str())
}
