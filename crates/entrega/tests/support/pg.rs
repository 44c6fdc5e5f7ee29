//! Fresh databases of either backend: an SQLite file, or a PostgreSQL database of its own on
//! `ENTREGA_TEST_PG` (default `postgres://postgres@127.0.0.1:5432`), dropped at the end.

use sqlx::{Connection, PgConnection};
use uuid::Uuid;

pub fn server_url() -> String {
    std::env::var("ENTREGA_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Drops a PostgreSQL database made for a test.
/// A WAL relay that just stopped may still have its sender on the database's slot for a
/// moment (`55006`): the drop is tried again for a while.
pub async fn drop_database(name: &str) {
    let mut admin = PgConnection::connect(&server_url()).await.expect("admin");
    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    for attempt in 0.. {
        match sqlx::query(&sql).execute(&mut admin).await {
            Ok(_) => return,
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("55006") && attempt < 100 =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("drop database: {e}"),
        }
    }
}

/// A fresh database of either backend: a SQLite file in `dir`, or a PostgreSQL database of
/// its own on [`server_url`], dropped by [`FreshDb::finish`].
pub struct FreshDb {
    pub db: entrega::db::Db,
    name: Option<String>,
    url: String,
}

impl FreshDb {
    pub async fn new(backend: entrega::db::Backend, dir: &super::TempDir, file: &str) -> Self {
        match backend {
            entrega::db::Backend::Sqlite => Self {
                db: entrega::db::Db::connect(&dir.url(file))
                    .await
                    .expect("sqlite"),
                name: None,
                url: dir.url(file),
            },
            entrega::db::Backend::Postgres => {
                let name = format!("entrega_t_{}", Uuid::new_v4().simple());
                let url = entrega_postgres::ensure_database(&server_url(), &name)
                    .await
                    .expect("create database");
                Self {
                    db: entrega::db::Db::connect(&url).await.expect("postgres"),
                    name: Some(name),
                    url,
                }
            }
        }
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PostgreSQL database's name (`None` on SQLite).
    pub fn name(&self) -> Option<String> {
        self.name.clone()
    }

    /// Closes the pool and drops the PostgreSQL database. Closing waits for connections in
    /// use; one a test still holds (a transaction left open) would make it wait forever, so
    /// the wait is bounded and the drop forces the database's sessions out.
    pub async fn finish(self) {
        let closed =
            tokio::time::timeout(std::time::Duration::from_secs(10), self.db.close()).await;
        assert!(
            closed.is_ok(),
            "a connection was still in use when the test finished"
        );
        if let Some(name) = self.name {
            drop_database(&name).await;
        }
    }
}
