//! What a query's rows decode into on both backends.

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Decode, Postgres, Sqlite, Type};

/// A row type both backends decode: tuples of [`Column`]s, or any struct deriving
/// `sqlx::FromRow` whose fields decode on both.
pub trait FromRow:
    for<'r> sqlx::FromRow<'r, SqliteRow> + for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin
{
}

impl<T> FromRow for T where
    T: for<'r> sqlx::FromRow<'r, SqliteRow> + for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin
{
}

/// A single value both backends decode (`String`, `i32`, `i64`, `f64`, `bool`, `Option` of
/// those, ...).
pub trait Column:
    for<'r> Decode<'r, Sqlite>
    + Type<Sqlite>
    + for<'r> Decode<'r, Postgres>
    + Type<Postgres>
    + Send
    + Unpin
{
}

impl<T> Column for T where
    T: for<'r> Decode<'r, Sqlite>
        + Type<Sqlite>
        + for<'r> Decode<'r, Postgres>
        + Type<Postgres>
        + Send
        + Unpin
{
}
