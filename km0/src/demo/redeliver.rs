//! Redelivery on purpose: the demo publishes some already-delivered events a second time,
//! byte for byte (same `id_evento`), as a relay that died between publish and mark would.
//! The inventory consumer must recognise every one as a duplicate and change nothing.

use entrega_core::OutgoingMessage;

use crate::broker::Broker;

/// Publishes again up to `count` records of `topic` written during this run (from the
/// per-partition offsets in `from`, the ends before the run; partitions not listed start at
/// 0), taken round-robin across partitions from the oldest, with their original key, headers
/// and payload. Returns how many.
pub async fn redeliver(
    broker: &Broker,
    topic: &str,
    from: &[(u32, i64)],
    count: usize,
) -> anyhow::Result<usize> {
    if count == 0 {
        return Ok(0);
    }
    let start = |partition: u32| {
        from.iter()
            .find(|(p, _)| *p == partition)
            .map_or(0, |(_, offset)| *offset)
    };
    let written: Vec<(u32, i64)> = broker
        .end_offsets(topic)
        .await?
        .into_iter()
        .filter(|(partition, end)| *end > start(*partition))
        .collect();
    let per_partition = count.div_ceil(written.len().max(1));
    let mut picked: Vec<OutgoingMessage> = Vec::with_capacity(count);
    for (partition, _) in &written {
        let records = broker
            .read(topic, *partition, start(*partition), per_partition)
            .await?;
        picked.extend(records.into_iter().map(|r| OutgoingMessage {
            topic: r.topic,
            key: r.key,
            headers: r.headers,
            payload: r.payload,
        }));
    }
    picked.truncate(count);
    broker.publisher().publish(&picked).await?;
    Ok(picked.len())
}
