//! Several statements written as one transaction in one round trip to the database, for a
//! hot path whose writes need nothing read back (a batch of requests and their stored
//! answers): on SQLite one command to the connection's thread holding `BEGIN IMMEDIATE`,
//! the statements and `COMMIT`; on PostgreSQL one statement, a `WITH` of the data-modifying
//! statements, committed on its own. What cannot be joined that way runs as an ordinary
//! transaction, one statement at a time, with the same outcome.

use entrega_core::StoreError;
use futures::TryStreamExt as _;
use sqlx::pool::PoolConnection;
use sqlx::{Executor as _, PgPool, Row as _, Sqlite, SqliteConnection, SqlitePool};

use super::placeholders::{shift, Shifted};
use super::{Backend, Db, Pool, Query, Sql, Value};

impl Db {
    /// Runs `statements`, in order, as one write transaction committed only if every one
    /// succeeds, and returns the rows each affected. They reach the database in one round
    /// trip where the backend allows it: on SQLite always (one command holding
    /// `BEGIN IMMEDIATE`, the statements and `COMMIT`); on PostgreSQL when every statement
    /// is an `INSERT`, `UPDATE` or `DELETE` without `RETURNING` (one statement, a `WITH`
    /// of them). Otherwise they run as a transaction of their own, one statement at a time.
    ///
    /// The statements must not depend on each other: on PostgreSQL they run over one
    /// snapshot, so none sees the rows another writes. Their placeholders must be numbered
    /// (`$1`, `$2`, ... of each statement's own parameters).
    pub async fn write_batch(&self, statements: Vec<Query>) -> Result<Vec<u64>, StoreError> {
        if statements.is_empty() {
            return Ok(Vec::new());
        }
        let joined = joined(&statements, self.backend());
        match (&self.pool, joined) {
            (Pool::Sqlite(pool), Some(joined)) => sqlite_batch(pool, joined).await,
            (Pool::Postgres(pool), Some(joined)) if joined.modifies_only() => {
                postgres_batch(pool, joined).await
            }
            _ => self.write_each(statements).await,
        }
    }

    /// The statements in a transaction of their own, one round trip each.
    async fn write_each(&self, statements: Vec<Query>) -> Result<Vec<u64>, StoreError> {
        let mut tx = self.begin().await?;
        let mut counts = Vec::with_capacity(statements.len());
        for statement in statements {
            counts.push(tx.execute(statement).await?);
        }
        tx.commit().await?;
        Ok(counts)
    }
}

/// The statements of one batch, renumbered to share one list of parameters.
struct Joined {
    statements: Vec<Shifted>,
    args: Vec<Value>,
}

impl Joined {
    /// Whether every statement changes rows and returns none (PostgreSQL's `WITH` form).
    fn modifies_only(&self) -> bool {
        self.statements
            .iter()
            .all(|s| matches!(s.verb.as_str(), "INSERT" | "UPDATE" | "DELETE") && !s.returning)
    }
}

/// The batch's statements with their placeholders numbered on, or `None` when one of them
/// cannot be joined to others (several statements in one text, unnumbered placeholders).
fn joined(statements: &[Query], backend: Backend) -> Option<Joined> {
    let mut shifted = Vec::with_capacity(statements.len());
    let mut args = Vec::new();
    for statement in statements {
        let text = statement.sql().text(backend);
        match shift(text, args.len(), statement.args().len()) {
            Ok(s) => shifted.push(s),
            Err(e) => {
                tracing::debug!(error = %e, "a statement cannot be joined; the batch runs one statement at a time");
                return None;
            }
        }
        args.extend_from_slice(statement.args());
    }
    Some(Joined {
        statements: shifted,
        args,
    })
}

/// A pooled SQLite connection that is closed, not given back, unless the batch settled: a
/// batch cut short (an error whose rollback failed, the caller gone mid-way) may have left
/// its transaction open, and closing the connection rolls it back.
struct Settling(Option<PoolConnection<Sqlite>>);

impl Settling {
    fn conn(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        self.0.as_deref_mut().ok_or_else(|| {
            StoreError::unavailable(std::io::Error::other("the connection was given back"))
        })
    }

    /// The transaction is over: the connection goes back to the pool.
    fn settled(&mut self) {
        drop(self.0.take());
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

async fn sqlite_batch(pool: &SqlitePool, joined: Joined) -> Result<Vec<u64>, StoreError> {
    let n = joined.statements.len();
    let body: Vec<&str> = joined.statements.iter().map(|s| s.text.as_str()).collect();
    let text = format!("BEGIN IMMEDIATE;\n{};\nCOMMIT", body.join(";\n"));
    let (sql, args) = Query::from_parts(Sql::Same(text.into()), joined.args).into_sqlite()?;
    let mut guard = Settling(Some(
        pool.acquire().await.map_err(entrega_sqlite::classify)?,
    ));
    let done: Result<Vec<_>, sqlx::Error> = guard
        .conn()?
        .execute_many(sqlx::query_with(sql.text(Backend::Sqlite), args))
        .try_collect()
        .await;
    match done {
        // BEGIN, the statements, COMMIT.
        Ok(done) if done.len() == n + 2 => {
            guard.settled();
            Ok(done[1..=n].iter().map(|d| d.rows_affected()).collect())
        }
        outcome => {
            // Stopped before its COMMIT: roll back, or close the connection if that fails
            // (also when nothing was begun: the lock was never taken).
            if guard.conn()?.execute("ROLLBACK").await.is_ok() {
                guard.settled();
            }
            Err(match outcome {
                Err(e) => entrega_sqlite::classify(e),
                Ok(done) => StoreError::rejected(std::io::Error::other(format!(
                    "a batch of {n} statements ran {} of them",
                    done.len().saturating_sub(2)
                ))),
            })
        }
    }
}

async fn postgres_batch(pool: &PgPool, joined: Joined) -> Result<Vec<u64>, StoreError> {
    let n = joined.statements.len();
    let parts: Vec<String> = joined
        .statements
        .iter()
        .enumerate()
        .map(|(i, s)| format!("w{i} AS ({} RETURNING 1)", s.text))
        .collect();
    let counts: Vec<String> = (0..n)
        .map(|i| format!("(SELECT COUNT(*) FROM w{i})"))
        .collect();
    let text = format!("WITH {} SELECT {}", parts.join(", "), counts.join(", "));
    let (sql, args) = Query::from_parts(Sql::Same(text.into()), joined.args).into_postgres()?;
    let row = sqlx::query_with(sql.text(Backend::Postgres), args)
        .fetch_one(pool)
        .await
        .map_err(entrega_postgres::classify)?;
    (0..n)
        .map(|i| {
            row.try_get::<i64, _>(i)
                .map(|c| u64::try_from(c).unwrap_or(0))
                .map_err(entrega_postgres::classify)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::db::{query, query_each};

    #[test]
    fn statements_are_numbered_on_across_the_batch() {
        let statements = [
            query("INSERT INTO a (x, y) VALUES ($1, $2) ON CONFLICT (x) DO NOTHING")
                .bind(1)
                .bind(2),
            query_each(
                "UPDATE b SET n = $1 WHERE k = $2",
                "UPDATE b SET n = to_timestamp($1::BIGINT / 1000.0) WHERE k = $2",
            )
            .bind(3)
            .bind("k"),
        ];
        let joined = joined(&statements, Backend::Postgres).unwrap();
        assert!(joined.modifies_only());
        assert_eq!(
            joined.statements[1].text,
            "UPDATE b SET n = to_timestamp($3::BIGINT / 1000.0) WHERE k = $4"
        );
        assert_eq!(joined.args.len(), 4);
        assert_eq!(joined.args[3], Value::Text(Some("k".into())));
    }

    #[test]
    fn only_changes_without_returning_make_one_postgres_statement() {
        let returning = [query("DELETE FROM a RETURNING x")];
        assert!(!joined(&returning, Backend::Postgres)
            .unwrap()
            .modifies_only());
        let select = [query("SELECT 1")];
        assert!(!joined(&select, Backend::Postgres).unwrap().modifies_only());
        let several = [query("DELETE FROM a; DELETE FROM b")];
        assert!(joined(&several, Backend::Sqlite).is_none());
    }
}
