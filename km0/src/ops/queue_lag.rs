//! `km0 lag` on RabbitMQ: a queue has no offsets, so a group's lag is what its queues hold,
//! ready and delivered-but-unacknowledged, and its dead letters are what its dead-letter
//! queue holds.

use std::fmt::Write as _;

use entrega_amqp::{Amqp, QueueDepth};
use entrega_core::TransportError;
use serde::Serialize;

/// One queue of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueRow {
    /// The queue.
    pub queue: String,
    /// Whether it exists.
    pub exists: bool,
    /// Messages waiting to be delivered.
    pub ready: u64,
    /// Messages delivered and not yet acknowledged; `null` when the management API did not
    /// answer.
    pub unacked: Option<u64>,
    /// Consumers on it (1 active per shard queue, the others waiting).
    pub consumers: u32,
}

/// One group on one topic, with totals over its queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupQueues {
    /// Consumer group.
    pub group: String,
    /// Topic it consumes.
    pub topic: String,
    /// Its queues, in shard order.
    pub queues: Vec<QueueRow>,
    /// Sum of the ready counts.
    pub ready: u64,
    /// Sum of the unacknowledged counts; `null` when one is unknown.
    pub unacked: Option<u64>,
    /// Its dead-letter queue.
    pub dead_letters: QueueRow,
}

/// What `km0 lag` shows on RabbitMQ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueLagReport {
    /// Every requested group on every requested topic.
    pub groups: Vec<GroupQueues>,
}

fn row(depth: QueueDepth) -> QueueRow {
    QueueRow {
        queue: depth.queue,
        exists: depth.exists,
        ready: depth.ready,
        unacked: depth.unacked,
        consumers: depth.consumers,
    }
}

/// Reads the depths of the queues of each (group, topic) of `pairs`.
pub async fn queue_lag_report(
    amqp: &Amqp,
    pairs: &[(String, String)],
) -> Result<QueueLagReport, TransportError> {
    let mut report = QueueLagReport { groups: Vec::new() };
    for (group, topic) in pairs {
        {
            let names = amqp.group_queues(group, topic);
            let mut all = names.queues();
            all.push(names.dead_letter_queue());
            let mut depths: Vec<QueueRow> = amqp
                .queue_depths(&all)
                .await?
                .into_iter()
                .map(row)
                .collect();
            let Some(dead_letters) = depths.pop() else {
                continue;
            };
            report.groups.push(GroupQueues {
                group: group.clone(),
                topic: topic.clone(),
                ready: depths.iter().map(|q| q.ready).sum(),
                unacked: depths.iter().map(|q| q.unacked).sum(),
                queues: depths,
                dead_letters,
            });
        }
    }
    Ok(report)
}

impl QueueLagReport {
    /// The report as tables for the terminal; an unknown unacknowledged count shows `?`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let unacked = |n: Option<u64>| n.map_or_else(|| "?".to_owned(), |n| n.to_string());
        for g in &self.groups {
            let _ = writeln!(out, "group {} on {} (RabbitMQ queues)", g.group, g.topic);
            let _ = writeln!(
                out,
                "  {:<32}  {:>10}  {:>10}  {:>9}",
                "queue", "ready", "unacked", "consumers"
            );
            for q in &g.queues {
                if !q.exists {
                    let _ = writeln!(out, "  {:<32}  (not declared yet)", q.queue);
                    continue;
                }
                let _ = writeln!(
                    out,
                    "  {:<32}  {:>10}  {:>10}  {:>9}",
                    q.queue,
                    q.ready,
                    unacked(q.unacked),
                    q.consumers
                );
            }
            let _ = writeln!(
                out,
                "  {:<32}  {:>10}  {:>10}",
                "total",
                g.ready,
                unacked(g.unacked)
            );
            let d = &g.dead_letters;
            if d.exists {
                let _ = writeln!(out, "dead letters in {}: {}", d.queue, d.ready);
            } else {
                let _ = writeln!(out, "dead letters in {}: none (not declared yet)", d.queue);
            }
        }
        if self.groups.iter().any(|g| g.unacked.is_none()) {
            out.push_str(
                "(unacked counts need RabbitMQ's management plugin on the broker URL's host, \
                 port 15672)\n",
            );
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn q(name: &str, ready: u64, unacked: Option<u64>) -> QueueRow {
        QueueRow {
            queue: name.into(),
            exists: true,
            ready,
            unacked,
            consumers: 1,
        }
    }

    #[test]
    fn totals_and_unknown_counts_render() {
        let report = QueueLagReport {
            groups: vec![GroupQueues {
                group: "inventario".into(),
                topic: "pedidos.eventos".into(),
                queues: vec![
                    q("inventario.pedidos.0", 3, Some(1)),
                    q("inventario.pedidos.1", 2, None),
                ],
                ready: 5,
                unacked: None,
                dead_letters: q("inventario.pedidos.dlq", 4, Some(0)),
            }],
        };
        let text = report.render();
        let total = text
            .lines()
            .find(|l| l.trim_start().starts_with("total"))
            .unwrap();
        assert_eq!(
            total.split_whitespace().collect::<Vec<_>>(),
            ["total", "5", "?"]
        );
        assert!(text.contains("dead letters in inventario.pedidos.dlq: 4"));
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["groups"][0]["unacked"].is_null());
        assert_eq!(json["groups"][0]["queues"][0]["unacked"], 1);
    }
}
