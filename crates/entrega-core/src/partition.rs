//! Stable key → partition placement, compatible with Kafka's Java default partitioner.

/// Kafka's murmur2 hash of `data` (the same function the Java client uses for keys).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Kafka mixes in the length as a 32-bit int; keys beyond 4 GiB are not a concern.
    let mut h = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` (at least 1), as Kafka's Java client places it.
pub fn partition_for(key: &str, partitions: u32) -> u32 {
    let positive = (murmur2(key.as_bytes()) & 0x7fff_ffff) as u32;
    positive % partitions.max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn matches_kafka_reference_values() {
        // Reference values from Kafka's own test of `Utils.murmur2`.
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (input, expected) in cases {
            assert_eq!(murmur2(input.as_bytes()), expected, "{input}");
        }
    }

    #[test]
    fn placement_is_stable_and_in_range() {
        for n in 1..20 {
            let p = partition_for("P-2026-000123", n);
            assert!(p < n);
            assert_eq!(p, partition_for("P-2026-000123", n));
        }
    }
}
