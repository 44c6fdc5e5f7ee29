//! Reading a member as the group coordinator describes it, in the classic consumer protocol:
//! its `ConsumerProtocolSubscription` (version, then the topics it subscribes to) and its
//! `ConsumerProtocolAssignment` (version, then each topic with its partitions); the user
//! data after them is not read here.

/// The partitions of `topic` in the assignment `bytes`; empty when there are none or the
/// bytes are not an assignment.
pub fn assigned_partitions(bytes: &[u8], topic: &str) -> Vec<u32> {
    read(bytes, topic).unwrap_or_default()
}

/// Whether the subscription `bytes` (a member's `ConsumerProtocolSubscription`: version,
/// then the topics it subscribes to) names `topic`; `false` when the bytes are not one.
pub fn subscribes_to(bytes: &[u8], topic: &str) -> bool {
    let read = || -> Option<bool> {
        let mut rest = bytes;
        let _version = i16::from_be_bytes(take::<2>(&mut rest)?);
        let topics = i32::from_be_bytes(take::<4>(&mut rest)?);
        for _ in 0..topics.max(0) {
            let len = usize::try_from(i16::from_be_bytes(take::<2>(&mut rest)?)).ok()?;
            let (name, after) = rest.split_at_checked(len)?;
            rest = after;
            if name == topic.as_bytes() {
                return Some(true);
            }
        }
        Some(false)
    };
    read().unwrap_or(false)
}

fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

fn read(bytes: &[u8], topic: &str) -> Option<Vec<u32>> {
    let mut rest = bytes;
    let _version = i16::from_be_bytes(take::<2>(&mut rest)?);
    let topics = i32::from_be_bytes(take::<4>(&mut rest)?);
    let mut found = Vec::new();
    for _ in 0..topics.max(0) {
        let len = usize::try_from(i16::from_be_bytes(take::<2>(&mut rest)?)).ok()?;
        let (name, after) = rest.split_at_checked(len)?;
        rest = after;
        let count = i32::from_be_bytes(take::<4>(&mut rest)?);
        for _ in 0..count.max(0) {
            let partition = i32::from_be_bytes(take::<4>(&mut rest)?);
            if name == topic.as_bytes() {
                found.push(u32::try_from(partition).ok()?);
            }
        }
    }
    Some(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn assignment(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut out = 1i16.to_be_bytes().to_vec();
        out.extend(i32::try_from(topics.len()).unwrap().to_be_bytes());
        for (name, partitions) in topics {
            out.extend(i16::try_from(name.len()).unwrap().to_be_bytes());
            out.extend(name.as_bytes());
            out.extend(i32::try_from(partitions.len()).unwrap().to_be_bytes());
            for p in *partitions {
                out.extend(p.to_be_bytes());
            }
        }
        out.extend((-1i32).to_be_bytes());
        out
    }

    #[test]
    fn the_partitions_of_one_topic_are_read() {
        let bytes = assignment(&[("a", &[0, 2]), ("pedidos.eventos", &[1, 4, 5])]);
        assert_eq!(
            assigned_partitions(&bytes, "pedidos.eventos"),
            vec![1, 4, 5]
        );
        assert_eq!(assigned_partitions(&bytes, "a"), vec![0, 2]);
        assert!(assigned_partitions(&bytes, "b").is_empty());
    }

    #[test]
    fn a_subscription_names_its_topics() {
        let mut bytes = 1i16.to_be_bytes().to_vec();
        bytes.extend(2i32.to_be_bytes());
        for name in ["a", "pedidos.eventos"] {
            bytes.extend(i16::try_from(name.len()).unwrap().to_be_bytes());
            bytes.extend(name.as_bytes());
        }
        bytes.extend((-1i32).to_be_bytes());
        assert!(subscribes_to(&bytes, "pedidos.eventos"));
        assert!(subscribes_to(&bytes, "a"));
        assert!(!subscribes_to(&bytes, "b"));
        assert!(!subscribes_to(&bytes[..9], "pedidos.eventos"));
        assert!(!subscribes_to(&[0, 1, 0x7f, 0xff, 0xff, 0xff], "x"));
    }

    #[test]
    fn bytes_that_are_not_an_assignment_give_nothing() {
        let bytes = assignment(&[("pedidos.eventos", &[1, 4])]);
        for cut in 0..bytes.len() - 4 {
            let read = assigned_partitions(&bytes[..cut], "pedidos.eventos");
            assert!(read.is_empty(), "{cut}: {read:?}");
        }
        assert!(assigned_partitions(&[0xff; 3], "x").is_empty());
        assert!(assigned_partitions(&[0, 1, 0x7f, 0xff, 0xff, 0xff], "x").is_empty());
    }
}
