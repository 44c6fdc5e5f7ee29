//! Running a [`Query`] on an executor of either backend (a pool or an open transaction). The
//! two modules are one body, generated for each backend's driver types.

use entrega_core::StoreError;
use sqlx::Executor;

use super::rows::FromRow;
use super::{Backend, Query};

macro_rules! backend_exec {
    ($module:ident, $db:ty, $split:ident, $classify:path, $backend:expr) => {
        pub(super) mod $module {
            use super::*;

            /// Runs a statement; returns the rows it affected.
            pub(crate) async fn execute<'c, E>(executor: E, q: Query) -> Result<u64, StoreError>
            where
                E: Executor<'c, Database = $db>,
            {
                let (sql, args) = q.$split()?;
                sqlx::query_with(sql.text($backend), args)
                    .execute(executor)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err($classify)
            }

            /// The first row, if any.
            pub(crate) async fn fetch_optional<'c, E, T>(
                executor: E,
                q: Query,
            ) -> Result<Option<T>, StoreError>
            where
                E: Executor<'c, Database = $db>,
                T: FromRow,
            {
                let (sql, args) = q.$split()?;
                sqlx::query_as_with::<_, T, _>(sql.text($backend), args)
                    .fetch_optional(executor)
                    .await
                    .map_err($classify)
            }

            /// Every row.
            pub(crate) async fn fetch_all<'c, E, T>(
                executor: E,
                q: Query,
            ) -> Result<Vec<T>, StoreError>
            where
                E: Executor<'c, Database = $db>,
                T: FromRow,
            {
                let (sql, args) = q.$split()?;
                sqlx::query_as_with::<_, T, _>(sql.text($backend), args)
                    .fetch_all(executor)
                    .await
                    .map_err($classify)
            }
        }
    };
}

backend_exec!(
    sqlite,
    sqlx::Sqlite,
    into_sqlite,
    entrega_sqlite::classify,
    Backend::Sqlite
);
backend_exec!(
    postgres,
    sqlx::Postgres,
    into_postgres,
    entrega_postgres::classify,
    Backend::Postgres
);
