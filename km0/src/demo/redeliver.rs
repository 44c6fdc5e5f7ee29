//! Redelivery on purpose: the demo publishes some already-delivered events a second time,
//! byte for byte (same `id_evento`), as a relay that died between publish and mark would.
//! The inventory consumer must recognise every one as a duplicate and change nothing.

use entrega_core::OutgoingMessage;

use crate::system::BrokerLog;

/// Publishes again up to `count` records of `topic`, taken round-robin across its partitions
/// from the oldest, with their original key, headers and payload. Returns how many.
pub async fn redeliver(broker: &BrokerLog, topic: &str, count: usize) -> anyhow::Result<usize> {
    if count == 0 {
        return Ok(0);
    }
    let ends = broker.end_offsets(topic).await?;
    let partitions = ends.iter().filter(|(_, end)| *end > 0).count().max(1);
    let per_partition = count.div_ceil(partitions);
    let mut picked: Vec<OutgoingMessage> = Vec::with_capacity(count);
    for (partition, _) in ends.iter().filter(|(_, end)| *end > 0) {
        let records = broker.read(topic, *partition, 0, per_partition).await?;
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
