//! Fresh databases for tests: one per test, random name, dropped at the end.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use entrega_postgres::{connect, ensure_database, PgPool};
use sqlx::{Connection, PgConnection};

/// Error type of test bodies.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// Result of test bodies.
pub type TestResult = Result<(), Error>;

/// The server tests run against.
pub fn server_url() -> String {
    std::env::var("ENTREGA_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A database created for one test.
pub struct TestDb {
    /// Pool on the database.
    pub pool: PgPool,
    /// Its URL.
    pub url: String,
    /// Its name.
    pub name: String,
}

impl TestDb {
    /// A new empty database.
    pub async fn empty() -> Result<Self, Error> {
        let name = format!("entrega_t_{}", uuid::Uuid::new_v4().simple());
        let url = ensure_database(&server_url(), &name).await?;
        let pool = connect(&url).await?;
        Ok(Self { pool, url, name })
    }

    /// Closes the pool and drops the database.
    pub async fn drop(self) -> TestResult {
        self.pool.close().await;
        let mut admin = PgConnection::connect(&server_url()).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .await?;
        admin.close().await?;
        Ok(())
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
