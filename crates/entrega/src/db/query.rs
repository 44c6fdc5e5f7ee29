//! A statement written once for both backends, with its parameters.

use std::borrow::Cow;

use entrega_core::StoreError;
use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments as _, Encode, Type};

use super::Backend;

/// The text of a statement: one for both backends (`$1`, `$2`, ... placeholders work on
/// SQLite too), or one per backend where their SQL really differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sql {
    /// The same text on SQLite and PostgreSQL.
    Same(Cow<'static, str>),
    /// A text for each backend, side by side.
    Each {
        /// The text run on SQLite.
        sqlite: Cow<'static, str>,
        /// The text run on PostgreSQL.
        postgres: Cow<'static, str>,
    },
}

impl Sql {
    /// The text run on `backend`.
    pub fn text(&self, backend: Backend) -> &str {
        match (self, backend) {
            (Self::Same(text), _) => text,
            (Self::Each { sqlite, .. }, Backend::Sqlite) => sqlite,
            (Self::Each { postgres, .. }, Backend::Postgres) => postgres,
        }
    }
}

/// One parameter of a [`Query`]. Each variant carries its type even when null, because
/// PostgreSQL types a parameter by what is bound to it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// `TEXT`.
    Text(Option<String>),
    /// `INTEGER` (`INT4`).
    I32(Option<i32>),
    /// `BIGINT` (`INT8`; SQLite's `INTEGER`).
    I64(Option<i64>),
    /// `DOUBLE PRECISION` (SQLite's `REAL`).
    F64(Option<f64>),
    /// `BOOLEAN` (SQLite stores 0 or 1).
    Bool(Option<bool>),
    /// `BYTEA` (SQLite's `BLOB`).
    Bytes(Option<Vec<u8>>),
    /// `UUID` (SQLite's text, hyphenated).
    Uuid(Option<uuid::Uuid>),
    /// `JSONB` (SQLite's text): see [`JsonText`](super::JsonText).
    Json(Option<String>),
    /// `TIMESTAMPTZ` from epoch ms (SQLite's UTC text): see [`TimeMs`](super::TimeMs).
    TimeMs(Option<i64>),
    /// `TEXT[]` (SQLite's JSON array): see [`TextList`](super::TextList).
    TextList(Vec<String>),
    /// `BIGINT[]` (SQLite's JSON array): see [`IntList`](super::IntList).
    IntList(Vec<i64>),
}

macro_rules! value_from {
    ($variant:ident, $ty:ty) => {
        impl From<$ty> for Value {
            fn from(v: $ty) -> Self {
                Self::$variant(Some(v.into()))
            }
        }
        impl From<Option<$ty>> for Value {
            fn from(v: Option<$ty>) -> Self {
                Self::$variant(v.map(Into::into))
            }
        }
    };
}

value_from!(Text, String);
value_from!(Text, &str);
value_from!(Text, &String);
value_from!(I32, i32);
value_from!(I64, i64);
value_from!(F64, f64);
value_from!(Bool, bool);
value_from!(Bytes, Vec<u8>);
value_from!(Bytes, &[u8]);

impl From<&Option<String>> for Value {
    fn from(v: &Option<String>) -> Self {
        Self::Text(v.clone())
    }
}

/// A statement and its parameters, run with [`Tx`](super::Tx) or [`Db`](super::Db) on
/// whichever backend they hold.
///
/// ```
/// use entrega::db::{query, query_each};
///
/// let take = query("UPDATE stock SET unidades = unidades - $1 WHERE producto = $2")
///     .bind(2)
///     .bind("tomate-rosa");
/// let created = query_each(
///     "SELECT creado_en FROM pedidos WHERE id = $1",
///     "SELECT to_char(creado_en, 'YYYY-MM-DD') FROM pedidos WHERE id = $1",
/// )
/// .bind("P-1");
/// # let _ = (take, created);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a query does nothing until it is run"]
pub struct Query {
    sql: Sql,
    args: Vec<Value>,
}

/// A statement with the same text on both backends.
pub fn query(sql: impl Into<Cow<'static, str>>) -> Query {
    Query {
        sql: Sql::Same(sql.into()),
        args: Vec::new(),
    }
}

/// A statement whose SQLite and PostgreSQL texts differ; both take the same parameters.
pub fn query_each(
    sqlite: impl Into<Cow<'static, str>>,
    postgres: impl Into<Cow<'static, str>>,
) -> Query {
    Query {
        sql: Sql::Each {
            sqlite: sqlite.into(),
            postgres: postgres.into(),
        },
        args: Vec::new(),
    }
}

impl Query {
    /// Adds the next parameter (`$1`, then `$2`, ...).
    pub fn bind(mut self, value: impl Into<Value>) -> Self {
        self.args.push(value.into());
        self
    }

    /// The statement's text(s).
    pub fn sql(&self) -> &Sql {
        &self.sql
    }

    /// The parameters bound so far, in order.
    pub fn args(&self) -> &[Value] {
        &self.args
    }

    /// A statement from its text(s) and parameters.
    pub(super) fn from_parts(sql: Sql, args: Vec<Value>) -> Self {
        Self { sql, args }
    }

    /// Splits into the text and the SQLite arguments.
    pub(super) fn into_sqlite<'q>(self) -> Result<(Sql, SqliteArguments<'q>), StoreError> {
        let mut args = SqliteArguments::default();
        for value in self.args {
            match value {
                Value::Uuid(v) => args.add(v.map(|id| id.hyphenated().to_string())),
                Value::Json(v) => args.add(v),
                Value::TimeMs(v) => args.add(v.map(entrega_core::utc::format_utc_ms)),
                Value::TextList(v) => args.add(serde_json::Value::from(v).to_string()),
                Value::IntList(v) => args.add(serde_json::Value::from(v).to_string()),
                scalar => add_scalar::<sqlx::Sqlite>(&mut args, scalar),
            }
            .map_err(StoreError::rejected)?;
        }
        Ok((self.sql, args))
    }

    /// Splits into the text and the PostgreSQL arguments.
    pub(super) fn into_postgres(self) -> Result<(Sql, PgArguments), StoreError> {
        let mut args = PgArguments::default();
        for value in self.args {
            match value {
                Value::Uuid(v) => args.add(v),
                Value::Json(v) => args.add(v.map(super::types::PgJsonb)),
                Value::TimeMs(v) => args.add(v.map(super::types::PgTimestamptz)),
                Value::TextList(v) => args.add(v),
                Value::IntList(v) => args.add(v),
                scalar => add_scalar::<sqlx::Postgres>(&mut args, scalar),
            }
            .map_err(StoreError::rejected)?;
        }
        Ok((self.sql, args))
    }
}

/// Adds a value every backend stores alike (text, numbers, booleans, bytes) to its arguments.
fn add_scalar<'q, DB>(args: &mut DB::Arguments<'q>, value: Value) -> Result<(), BoxDynError>
where
    DB: sqlx::Database,
    Option<String>: Encode<'q, DB> + Type<DB>,
    Option<i32>: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    Option<f64>: Encode<'q, DB> + Type<DB>,
    Option<bool>: Encode<'q, DB> + Type<DB>,
    Option<Vec<u8>>: Encode<'q, DB> + Type<DB>,
{
    match value {
        Value::Text(v) => args.add(v),
        Value::I32(v) => args.add(v),
        Value::I64(v) => args.add(v),
        Value::F64(v) => args.add(v),
        Value::Bool(v) => args.add(v),
        Value::Bytes(v) => args.add(v),
        other => Err(format!("{other:?} is bound by its backend, not as a scalar").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_gets_its_own_text_and_the_same_parameters() {
        let q = query_each("SELECT 1", "SELECT 2")
            .bind("a")
            .bind(None::<i64>);
        assert_eq!(q.sql().text(Backend::Sqlite), "SELECT 1");
        assert_eq!(q.sql().text(Backend::Postgres), "SELECT 2");
        assert_eq!(
            q.args(),
            &[Value::Text(Some("a".into())), Value::I64(None)][..]
        );
        let same = query("SELECT $1").bind(3);
        assert_eq!(same.sql().text(Backend::Postgres), "SELECT $1");
        assert_eq!(same.sql().text(Backend::Sqlite), "SELECT $1");
    }
}
