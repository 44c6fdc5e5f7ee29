//! What alerts are built on: dead letters per topic and reason (class), by state, and the
//! depth of each origin topic's retry topic. The JSON shape of [`DlqStats`] is stable and
//! documented in `docs/OPERATIONS.md`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::error::DlqError;
use super::filter::DlqFilter;
use super::letter::DeadLetter;
use super::DeadLetters;

/// Dead letters by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Waiting for an operator: what a depth alert watches.
    pub pending: u64,
    /// Published again.
    pub replayed: u64,
    /// Set aside for good.
    pub discarded: u64,
    /// All of them.
    pub total: u64,
}

impl Counts {
    fn add(&mut self, letter: &DeadLetter) {
        match letter.state() {
            "pending" => self.pending += 1,
            "replayed" => self.replayed += 1,
            _ => self.discarded += 1,
        }
        self.total += 1;
    }
}

/// Dead letters of one reason, or of one reason class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    /// The reason (`motivo`), or its class in [`TopicStats::by_class`].
    #[serde(rename = "motivo")]
    pub reason: String,
    /// The reason's class ([`super::reason_class`]).
    pub class: String,
    /// By state.
    #[serde(flatten)]
    pub counts: Counts,
}

/// How many records wait on the retry topic (`<topic>.retry`) of an origin topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryDepth {
    /// The retry topic.
    pub topic: String,
    /// The group whose committed offsets were subtracted, if one was given.
    pub group: Option<String>,
    /// Records ever written to it (sum of end offsets; 0 when it does not exist).
    pub end: i64,
    /// The group's committed offsets summed, when a group was given.
    pub committed: Option<i64>,
    /// Records not yet handled: `end - committed` with a group, else `end`.
    pub depth: i64,
}

/// One dead-letter topic's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopicStats {
    /// The dead-letter topic.
    pub topic: String,
    /// The topic it serves (the name without `.dlq`).
    pub origin_topic: String,
    /// Every dead letter selected, by state.
    #[serde(flatten)]
    pub counts: Counts,
    /// By exact reason, most pending first.
    #[serde(rename = "by_motivo")]
    pub by_reason: Vec<ReasonCount>,
    /// By reason class, most pending first (`motivo` holds the class).
    pub by_class: Vec<ReasonCount>,
    /// The origin topic's retry topic.
    pub retry: RetryDepth,
}

/// `km0 dlq stats`: per tended topic. See `docs/OPERATIONS.md` for alert rules on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqStats {
    /// One entry per dead-letter topic, in the order tended.
    pub topics: Vec<TopicStats>,
    /// Sums over every topic.
    pub totals: Counts,
}

impl DeadLetters {
    /// Counts the dead letters `filter` selects (every state) per topic and reason, and the
    /// retry depth of each origin topic (net of `retry_group`'s commits, if given).
    pub async fn stats(
        &self,
        filter: &DlqFilter,
        retry_group: Option<&str>,
    ) -> Result<DlqStats, DlqError> {
        let letters = self.read(filter).await?;
        let mut topics: Vec<String> = self.topics.clone();
        if let Some(t) = &filter.topic {
            topics.retain(|x| x == t);
        }
        if !filter.ids.is_empty() {
            topics.retain(|x| filter.ids.iter().any(|id| id.topic == *x));
        }
        let mut out = DlqStats {
            topics: Vec::with_capacity(topics.len()),
            totals: Counts::default(),
        };
        for topic in topics {
            let mine: Vec<&DeadLetter> = letters.iter().filter(|l| l.id.topic == topic).collect();
            let mut counts = Counts::default();
            let mut by_reason: BTreeMap<&str, Counts> = BTreeMap::new();
            let mut by_class: BTreeMap<&str, Counts> = BTreeMap::new();
            for letter in &mine {
                counts.add(letter);
                by_reason.entry(&letter.reason).or_default().add(letter);
                by_class.entry(letter.class()).or_default().add(letter);
            }
            let origin_topic = topic.strip_suffix(".dlq").unwrap_or(&topic).to_owned();
            let retry = self.retry_depth(&origin_topic, retry_group).await?;
            out.totals.pending += counts.pending;
            out.totals.replayed += counts.replayed;
            out.totals.discarded += counts.discarded;
            out.totals.total += counts.total;
            out.topics.push(TopicStats {
                counts,
                by_reason: ranked(by_reason, |m| super::letter::reason_class(m).to_owned()),
                by_class: ranked(by_class, str::to_owned),
                origin_topic,
                topic,
                retry,
            });
        }
        Ok(out)
    }

    async fn retry_depth(&self, origin: &str, group: Option<&str>) -> Result<RetryDepth, DlqError> {
        let topic = format!("{origin}.retry");
        let ends = self.inspector.end_offsets(&topic).await?;
        let end: i64 = ends.iter().map(|(_, e)| *e).sum();
        let committed = match group {
            Some(g) => {
                let done = self.inspector.committed(g, &topic).await?;
                Some(done.iter().map(|(_, c)| *c).sum::<i64>())
            }
            None => None,
        };
        Ok(RetryDepth {
            depth: (end - committed.unwrap_or(0)).max(0),
            group: group.map(str::to_owned),
            topic,
            end,
            committed,
        })
    }
}

/// Counts as rows, most pending first, then by name.
fn ranked(map: BTreeMap<&str, Counts>, class: impl Fn(&str) -> String) -> Vec<ReasonCount> {
    let mut rows: Vec<ReasonCount> = map
        .into_iter()
        .map(|(reason, counts)| ReasonCount {
            class: class(reason),
            reason: reason.to_owned(),
            counts,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.counts
            .pending
            .cmp(&a.counts.pending)
            .then(a.reason.cmp(&b.reason))
    });
    rows
}
