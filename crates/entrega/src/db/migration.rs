//! An application's schema steps, with the SQLite and PostgreSQL texts side by side, run by
//! the same runner as entrega's own sets.

use super::Sql;

/// One numbered step of an application's set (see [`Db::apply_migrations`](super::Db::apply_migrations)).
/// Recorded in `entrega_migrations` under the set's name once applied, so it runs once per
/// database even if what it inserted is later deleted.
#[derive(Debug, Clone)]
pub struct Migration {
    /// Position in the set, from 1.
    pub version: i64,
    /// What the step does, recorded for operators.
    pub description: &'static str,
    /// Its statements (several allowed, no parameters), the same for both backends or one
    /// text each.
    pub sql: Sql,
}

impl Migration {
    /// A step whose statements read the same on both backends.
    pub const fn same(version: i64, description: &'static str, sql: &'static str) -> Self {
        Self {
            version,
            description,
            sql: Sql::Same(std::borrow::Cow::Borrowed(sql)),
        }
    }

    /// A step with one text per backend.
    pub const fn each(
        version: i64,
        description: &'static str,
        sqlite: &'static str,
        postgres: &'static str,
    ) -> Self {
        Self {
            version,
            description,
            sql: Sql::Each {
                sqlite: std::borrow::Cow::Borrowed(sqlite),
                postgres: std::borrow::Cow::Borrowed(postgres),
            },
        }
    }
}
