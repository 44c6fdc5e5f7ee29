//! Multi-row statements in few shapes: a batch of rows is written as runs whose lengths are
//! powers of two, so the statements' texts come in a handful of shapes and stay in the
//! drivers' prepared-statement caches instead of one new text per batch size.

use std::ops::Range;

/// Splits `len` rows into consecutive runs, each a power of two of at most `max` rows
/// (`max` is rounded down to a power of two): 21 rows with `max` 64 become 16 + 4 + 1.
pub fn row_runs(len: usize, max: usize) -> Vec<Range<usize>> {
    let cap = prev_power_of_two(max.max(1));
    let mut runs = Vec::new();
    let mut start = 0;
    while start < len {
        let run = prev_power_of_two(len - start).min(cap);
        runs.push(start..start + run);
        start += run;
    }
    runs
}

/// The largest power of two not above `n` (`n` ≥ 1).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_every_row_once_in_power_of_two_lengths() {
        for len in 0..300 {
            let runs = row_runs(len, 64);
            let mut next = 0;
            for run in &runs {
                assert_eq!(run.start, next);
                assert!(run.len().is_power_of_two() && run.len() <= 64, "{run:?}");
                next = run.end;
            }
            assert_eq!(next, len);
        }
        assert_eq!(row_runs(21, 64), vec![0..16, 16..20, 20..21]);
        assert_eq!(row_runs(130, 100), vec![0..64, 64..128, 128..130]);
    }
}
