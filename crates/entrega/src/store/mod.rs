//! entrega's own tables, each store written once over the one database layer ([`Db`],
//! [`Tx`]). What truly differs between SQLite and PostgreSQL stays small and in one place:
//! a statement's two texts side by side ([`query_each`]), the column types bound the same
//! way ([`TimeMs`], [`JsonText`], [`TextList`]), and the backends' own wake-ups and locks.
//!
//! [`Db`]: crate::db::Db
//! [`Tx`]: crate::db::Tx
//! [`query_each`]: crate::db::query_each
//! [`TimeMs`]: crate::db::TimeMs
//! [`JsonText`]: crate::db::JsonText
//! [`TextList`]: crate::db::TextList

pub(crate) mod dead_letters;
pub(crate) mod inbox;
pub(crate) mod leases;
pub(crate) mod log;
pub(crate) mod outbox;
pub(crate) mod parking;
pub(crate) mod relay_lanes;
pub(crate) mod wakeup;

/// A partition, lane or count as stored (`INT`).
pub(crate) fn int4(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
