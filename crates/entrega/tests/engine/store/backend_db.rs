//! A fresh database of one backend for the tests written against its own pool (the log
//! transport's), on the same fixture as every store test.

use std::future::Future;
use std::time::Duration;

use entrega::db::{Backend, Db};
use entrega_core::MigrationSet;
use sqlx::{PgPool, SqlitePool};

use super::conformance::Fixture;

/// Error type of test bodies.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// Result of test bodies.
pub type TestResult = Result<(), Error>;

/// A fresh SQLite database file with `sets` migrated.
pub struct SqliteDb {
    pub pool: SqlitePool,
    pub db: Db,
    pub url: String,
    /// Holds the file's directory, removed when dropped.
    _fixture: Fixture,
}

impl SqliteDb {
    pub async fn new(sets: &[MigrationSet]) -> Self {
        let fixture = Fixture::new(Backend::Sqlite, sets).await.expect("fixture");
        let db = fixture.db().clone();
        let pool = db.sqlite().expect("sqlite").clone();
        let url = pool.connect_options().get_filename().display().to_string();
        Self {
            pool,
            db,
            url: format!("sqlite://{url}"),
            _fixture: fixture,
        }
    }

    /// Another, independent pool on the same file (as a second process would open it).
    pub async fn another_pool(&self) -> SqlitePool {
        entrega_sqlite::connect(&self.url)
            .await
            .expect("connect again")
    }
}

/// A fresh PostgreSQL database with `sets` migrated.
pub struct PgDb {
    pub pool: PgPool,
    pub db: Db,
    pub url: String,
    fixture: Fixture,
}

impl PgDb {
    pub async fn with(sets: &[MigrationSet]) -> Result<Self, Error> {
        let fixture = Fixture::new(Backend::Postgres, sets).await?;
        let db = fixture.db().clone();
        let pool = db.postgres().ok_or("postgres")?.clone();
        let url = format!(
            "{}/{}",
            crate::support::pg::server_url(),
            fixture.fresh.name().ok_or("a PostgreSQL database")?
        );
        Ok(Self {
            pool,
            db,
            url,
            fixture,
        })
    }

    pub async fn drop(self) -> TestResult {
        self.fixture.finish().await
    }
}

/// Polls `check` until it returns true or `limit` passes; returns the last answer.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> Result<bool, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
