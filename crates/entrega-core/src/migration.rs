//! Numbered schema steps, as every migration runner of entrega applies them: entrega's own
//! sets ([`MigrationSet`](crate::MigrationSet)) and an application's tables alike.
//!
//! A runner records each applied step in `entrega_migrations` under the name of its set, in
//! the same transaction as the step, and refuses a database that records a newer step than it
//! knows ([`StoreError::SchemaTooNew`](crate::StoreError::SchemaTooNew)).

/// One numbered, described change of a set, written for one backend.
#[derive(Debug, Clone, Copy)]
pub struct Migration<'a> {
    /// Position in the set, from 1; steps run in this order, each once.
    pub version: i64,
    /// What the step does, recorded for operators.
    pub description: &'a str,
    /// What it runs, in order.
    pub steps: &'a [Step<'a>],
}

/// Part of a [`Migration`].
#[derive(Debug, Clone, Copy)]
pub enum Step<'a> {
    /// Statements run as one script (several allowed, no parameters).
    Sql(&'a str),
    /// `ALTER TABLE .. ADD COLUMN` unless the column exists; for backends without
    /// `ADD COLUMN IF NOT EXISTS` (SQLite), to adopt tables created by other tools.
    AddColumn {
        /// The table.
        table: &'a str,
        /// The new column.
        column: &'a str,
        /// Its type and constraints.
        definition: &'a str,
    },
}

/// The latest version of `migrations` (0 for none).
pub fn latest_version(migrations: &[Migration<'_>]) -> i64 {
    migrations.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Whether `name` is one of entrega's own sets, which applications may not use for theirs.
pub fn is_reserved_set(name: &str) -> bool {
    crate::MigrationSet::ALL
        .iter()
        .any(|set| set.name() == name)
}
