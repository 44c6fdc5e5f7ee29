//! `km0 lag`: how far consumer groups are behind, per partition, and how many dead letters
//! wait on each topic's dead-letter topic. Read through [`LogInspector`] and [`group_lag`],
//! so it is the same on the log transport and on Kafka; on RabbitMQ, which has no offsets,
//! it is the depth of each group's queues ([`super::queue_lag`]).

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::Args;
use entrega_core::{group_lag, LogInspector, TransportError};
use serde::Serialize;

use crate::wiring::System;

/// One partition of one group's lag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionRow {
    /// The partition.
    pub partition: u32,
    /// The group's committed next offset; `None` when it never committed here.
    pub committed: Option<i64>,
    /// The partition's end offset (next offset to be written).
    pub end: i64,
    /// Records not yet committed (from 0 when never committed).
    pub lag: i64,
}

/// One group on one topic, with totals over its partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupLag {
    /// Consumer group.
    pub group: String,
    /// Topic it consumes.
    pub topic: String,
    /// Per partition, in partition order (empty when the topic does not exist).
    pub partitions: Vec<PartitionRow>,
    /// Sum of the committed offsets (partitions never committed count 0).
    pub committed: i64,
    /// Sum of the end offsets: records ever written to the topic.
    pub end: i64,
    /// Sum of the lags.
    pub lag: i64,
    /// Members of the group alive on the topic now (`None`: the transport cannot tell); 0
    /// means nobody consumes it, in this deployment or elsewhere.
    pub members: Option<u32>,
}

/// One partition's end offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionEnd {
    /// The partition.
    pub partition: u32,
    /// Its end offset.
    pub end: i64,
}

/// End offsets of a topic read by no group of interest (dead letters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopicEnds {
    /// The topic.
    pub topic: String,
    /// Per partition (empty when the topic does not exist yet).
    pub partitions: Vec<PartitionEnd>,
    /// Records ever written to it.
    pub end: i64,
}

/// What `km0 lag` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LagReport {
    /// Every requested group on every requested topic.
    pub groups: Vec<GroupLag>,
    /// The dead-letter topic (`<topic>.dlq`) of every requested topic.
    pub dead_letters: Vec<TopicEnds>,
}

/// Each group on each topic: what `--group` and `--topic` ask for together.
pub fn every_pair(groups: &[String], topics: &[String]) -> Vec<(String, String)> {
    groups
        .iter()
        .flat_map(|g| topics.iter().map(move |t| (g.clone(), t.clone())))
        .collect()
}

/// Every consumer group km0's components own, each on the topic it consumes.
pub fn km0_groups() -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for owned in crate::wiring::groups() {
        let pair = (owned.group.to_owned(), owned.topic.to_owned());
        if !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    pairs
}

/// Each of `groups` on the topic km0's components consume it from (`pedidos.eventos` for a
/// group of no component).
pub fn on_their_topics(groups: &[String]) -> Vec<(String, String)> {
    let known = km0_groups();
    groups
        .iter()
        .flat_map(|group| {
            let mine: Vec<(String, String)> =
                known.iter().filter(|(g, _)| g == group).cloned().collect();
            if mine.is_empty() {
                vec![(group.clone(), crate::services::pedidos::TOPIC.to_owned())]
            } else {
                mine
            }
        })
        .collect()
}

/// The topics of `pairs`, each once, in order.
fn topics_of(pairs: &[(String, String)]) -> Vec<String> {
    let mut topics: Vec<String> = Vec::new();
    for (_, topic) in pairs {
        if !topics.contains(topic) {
            topics.push(topic.clone());
        }
    }
    topics
}

/// Reads the lag of each (group, topic) of `pairs`, and the ends of each topic's dead-letter
/// topic.
pub async fn lag_report(
    inspector: &dyn LogInspector,
    pairs: &[(String, String)],
) -> Result<LagReport, TransportError> {
    let topics = topics_of(pairs);
    let mut report = LagReport {
        groups: Vec::with_capacity(pairs.len()),
        dead_letters: Vec::with_capacity(topics.len()),
    };
    for (group, topic) in pairs {
        {
            let partitions: Vec<PartitionRow> = group_lag(inspector, group, topic)
                .await?
                .into_iter()
                .map(|p| PartitionRow {
                    partition: p.partition,
                    committed: p.committed,
                    end: p.end,
                    lag: p.lag(),
                })
                .collect();
            // Who runs the group is extra: a refusal (no right to describe groups, a
            // coordinator timeout) leaves it unknown rather than failing the lag it goes with.
            let members = inspector.members(group, topic).await.unwrap_or_else(|e| {
                tracing::warn!(group, topic, error = %e, "could not count the group's members");
                None
            });
            report.groups.push(GroupLag {
                group: group.clone(),
                topic: topic.clone(),
                members,
                committed: partitions.iter().filter_map(|p| p.committed).sum(),
                end: partitions.iter().map(|p| p.end).sum(),
                lag: partitions.iter().map(|p| p.lag).sum(),
                partitions,
            });
        }
    }
    for topic in &topics {
        let dlq = format!("{topic}.dlq");
        let partitions: Vec<PartitionEnd> = inspector
            .end_offsets(&dlq)
            .await?
            .into_iter()
            .map(|(partition, end)| PartitionEnd { partition, end })
            .collect();
        report.dead_letters.push(TopicEnds {
            topic: dlq,
            end: partitions.iter().map(|p| p.end).sum(),
            partitions,
        });
    }
    Ok(report)
}

impl LagReport {
    /// The report as tables for the terminal; a partition never committed shows `-`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for g in &self.groups {
            let members = match g.members {
                Some(0) => " (no member running)".to_owned(),
                Some(1) => " (1 member)".to_owned(),
                Some(n) => format!(" ({n} members)"),
                None => String::new(),
            };
            let _ = writeln!(out, "group {} on {}{members}", g.group, g.topic);
            if g.partitions.is_empty() {
                out.push_str("  (no such topic)\n");
                continue;
            }
            let _ = writeln!(
                out,
                "  {:>9}  {:>12}  {:>12}  {:>10}",
                "partition", "committed", "end", "lag"
            );
            for p in &g.partitions {
                let committed = p
                    .committed
                    .map_or_else(|| "-".to_owned(), |c| c.to_string());
                let _ = writeln!(
                    out,
                    "  {:>9}  {:>12}  {:>12}  {:>10}",
                    p.partition, committed, p.end, p.lag
                );
            }
            let _ = writeln!(
                out,
                "  {:>9}  {:>12}  {:>12}  {:>10}",
                "total", g.committed, g.end, g.lag
            );
        }
        for t in &self.dead_letters {
            if t.partitions.is_empty() {
                let _ = writeln!(out, "dead letters on {}: none (topic not created)", t.topic);
                continue;
            }
            let per_partition: Vec<String> = t
                .partitions
                .iter()
                .map(|p| format!("{}:{}", p.partition, p.end))
                .collect();
            let _ = writeln!(
                out,
                "dead letters on {}: {} (end offsets {})",
                t.topic,
                t.end,
                per_partition.join(" ")
            );
        }
        out
    }
}

/// `km0 lag`.
#[derive(Debug, Args)]
pub struct LagArgs {
    /// Consumer group to report (repeat for several); with neither `--group` nor
    /// `--topic`, every group of km0's components on the topic it consumes.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Topic to report (repeat for several); each group asked for is reported on each
    /// topic asked for (default: `pedidos.eventos`, or every group's own topic when no group
    /// is named). Each topic's dead-letter topic `<topic>.dlq` is reported too.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// `km0 lag`: the report for the requested groups and topics, printed.
pub async fn run(system: &System, args: LagArgs) -> anyhow::Result<()> {
    let pairs = match (args.groups.is_empty(), args.topics.is_empty()) {
        (true, true) => km0_groups(),
        (true, false) => km0_groups()
            .into_iter()
            .filter(|(_, topic)| args.topics.contains(topic))
            .collect(),
        (false, true) => every_pair(&args.groups, &[crate::services::pedidos::TOPIC.to_owned()]),
        (false, false) => every_pair(&args.groups, &args.topics),
    };
    let broker = system.broker().await.context("opening the broker")?;
    if let Some(amqp) = broker.as_amqp() {
        let report = super::queue_lag::queue_lag_report(amqp, &pairs).await;
        broker.close().await;
        let report = report.context("reading queue depths")?;
        if args.json {
            crate::ops::terminal::println(&serde_json::to_string_pretty(&report)?);
        } else {
            crate::ops::terminal::print(&report.render());
        }
        return Ok(());
    }
    let report = lag_report(broker.inspector().as_ref(), &pairs).await;
    broker.close().await;
    let report = report.context("reading offsets")?;
    if args.json {
        crate::ops::terminal::println(&serde_json::to_string_pretty(&report)?);
    } else {
        crate::ops::terminal::print(&report.render());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn report() -> LagReport {
        LagReport {
            groups: vec![GroupLag {
                group: "inventario".into(),
                topic: "pedidos.eventos".into(),
                partitions: vec![
                    PartitionRow {
                        partition: 0,
                        committed: Some(3),
                        end: 5,
                        lag: 2,
                    },
                    PartitionRow {
                        partition: 1,
                        committed: None,
                        end: 4,
                        lag: 4,
                    },
                ],
                committed: 3,
                end: 9,
                lag: 6,
                members: Some(0),
            }],
            dead_letters: vec![TopicEnds {
                topic: "pedidos.eventos.dlq".into(),
                partitions: vec![],
                end: 0,
            }],
        }
    }

    #[test]
    fn never_committed_partitions_render_as_a_dash_and_null() {
        let text = report().render();
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["1", "-", "4", "4"]
        );
        let json = serde_json::to_value(report()).unwrap();
        assert!(json["groups"][0]["partitions"][1]["committed"].is_null());
        assert_eq!(json["groups"][0]["lag"], 6);
        assert_eq!(json["groups"][0]["members"], 0);
        assert!(
            text.contains("group inventario on pedidos.eventos (no member running)"),
            "{text}"
        );
    }
}
