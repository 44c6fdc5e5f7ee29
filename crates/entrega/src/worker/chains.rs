//! Planning per-key work: a poll's records split into chains that may run concurrently, and a
//! chain split into the batches handed to one handler call.

use std::collections::HashMap;
use std::ops::Range;

/// Splits a poll into chains of record indices. Records sharing a partition and a key form one
/// chain, in poll order (which is offset order within a partition); records without a key
/// form one chain per partition, so they stay serial. Chains come in order of their first
/// record.
pub(super) fn plan<'a>(keys: impl IntoIterator<Item = (u32, Option<&'a str>)>) -> Vec<Vec<usize>> {
    let mut index: HashMap<(u32, Option<&'a str>), usize> = HashMap::new();
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let chain = *index.entry(key).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        if let Some(chain) = chains.get_mut(chain) {
            chain.push(i);
        }
    }
    chains
}

/// Splits a chain into batches: consecutive records for the same handler (`Some(index)`) go
/// together; a record no handler runs (`None`: ignored, malformed, already done) is alone.
pub(super) fn batches(handlers: &[Option<usize>]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, handler) in handlers.iter().enumerate() {
        match out.last_mut() {
            Some(last) if handler.is_some() && handlers.get(last.start) == Some(handler) => {
                last.end = i + 1;
            }
            _ => out.push(i..i + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{batches, plan};

    #[test]
    fn chains_group_by_partition_and_key_in_order() {
        let keys = [
            (0, Some("a")),
            (0, Some("b")),
            (1, Some("a")),
            (0, Some("a")),
            (0, None),
            (1, None),
            (0, None),
            (0, Some("b")),
        ];
        assert_eq!(
            plan(keys),
            vec![vec![0, 3], vec![1, 7], vec![2], vec![4, 6], vec![5]]
        );
    }

    #[test]
    fn an_empty_poll_has_no_chains() {
        assert!(plan(std::iter::empty()).is_empty());
    }

    #[test]
    fn batches_join_consecutive_records_of_one_handler() {
        let handlers = [
            Some(0),
            Some(0),
            None,
            None,
            Some(0),
            Some(1),
            Some(1),
            Some(0),
        ];
        assert_eq!(batches(&handlers), vec![0..2, 2..3, 3..4, 4..5, 5..7, 7..8]);
        assert!(batches(&[]).is_empty());
    }
}
