//! The statements that store request answers (`entrega_answers`), shared by a
//! transaction's [`Tx::store_answers`](super::Tx::store_answers) and the one-round-trip
//! batches of [`crate::rpc::StoredAnswers`].

use super::{query, row_runs, Query};

/// What storing an answer does when one is stored under its key already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Writes nothing for it (the statement's row count falls short).
    Skip,
    /// Fails the statement (a unique violation), and with it the transaction.
    Fail,
}

/// The statements storing `answers` (key, body) of `consumer`: runs of up to 128 rows
/// (four parameters a row, well under SQLite's oldest limit of 999 per statement) in
/// power-of-two lengths, so their texts stay in the statement caches.
pub(crate) fn insert_answers(
    consumer: &str,
    answers: &[(&str, &[u8])],
    repeat: Repeat,
) -> Vec<Query> {
    let now = entrega_core::now_ms();
    let tail = match repeat {
        Repeat::Skip => " ON CONFLICT DO NOTHING",
        Repeat::Fail => "",
    };
    row_runs(answers.len(), 128)
        .into_iter()
        .map(|run| {
            let chunk = &answers[run];
            let rows = (0..chunk.len())
                .map(|i| {
                    let n = 4 * i;
                    format!("(${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4)
                })
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "INSERT INTO entrega_answers (request_key, consumer, answer, answered_at_ms) \
                 VALUES {rows}{tail}"
            );
            chunk.iter().fold(query(sql), |q, (key, answer)| {
                q.bind(*key).bind(consumer).bind(answer.to_vec()).bind(now)
            })
        })
        .collect()
}
