//! Where km0 keeps its data: `--database` and `--broker` URLs turned into connected backends.
//!
//! `--database` names a *place* for the per-service databases: `sqlite://DIR` (one file per
//! service in DIR) or `postgres://user@host:port` (one database per service on that server).
//! `--broker` names the broker: the log transport's database itself (`sqlite://DIR/broker.db`
//! or `postgres://user@host:port/km0_broker`) or a Kafka cluster (`kafka://host:port`, see
//! [`BrokerUrl`]). This is the only place that looks at URL schemes.

mod broker_url;
mod retry;

use std::path::PathBuf;

use entrega::Db;
use entrega_core::StoreError;

use super::component::Database;

pub use broker_url::{is_kafka, BrokerUrl, BrokerUrlError};
pub use retry::{RetryArgs, RetryMode};

/// A URL km0 does not know how to open.
#[derive(Debug, thiserror::Error)]
#[error("unsupported url `{0}`: expected sqlite://... or postgres://...")]
pub struct UnsupportedUrl(pub String);

/// Where the per-service databases live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataPlace {
    /// A directory holding `pedidos.db` and `inventario.db`.
    SqliteDir(PathBuf),
    /// A PostgreSQL server URL (no database name); databases are `km0_<service>`.
    PostgresServer(String),
}

impl DataPlace {
    /// Parses a `--database` URL.
    pub fn parse(url: &str) -> Result<Self, UnsupportedUrl> {
        if let Some(dir) = sqlite_path(url) {
            if dir.is_empty() {
                return Err(UnsupportedUrl(entrega_core::redact_url(url)));
            }
            Ok(Self::SqliteDir(PathBuf::from(dir)))
        } else if is_postgres(url) {
            Ok(Self::PostgresServer(split_database(url).0))
        } else {
            Err(UnsupportedUrl(entrega_core::redact_url(url)))
        }
    }
}

/// The per-service databases: a place and how their names are formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Databases {
    /// Where they live.
    pub place: DataPlace,
    /// Name prefix (`--db-prefix`): databases `<prefix><service>` and files
    /// `<prefix><service>.db`. Without one: `km0_<service>` on Postgres, `<service>.db` on
    /// SQLite.
    pub prefix: Option<String>,
}

impl Databases {
    /// Databases at `place` with the default names.
    pub fn new(place: DataPlace) -> Self {
        Self {
            place,
            prefix: None,
        }
    }

    /// The database name (Postgres) or file stem (SQLite) of a service's database.
    pub fn name(&self, database: &Database) -> String {
        match (&self.prefix, &self.place) {
            (Some(prefix), _) => format!("{prefix}{}", database.name),
            (None, DataPlace::SqliteDir(_)) => database.name.to_owned(),
            (None, DataPlace::PostgresServer(_)) => format!("km0_{}", database.name),
        }
    }

    /// The full URL of `database`, creating the Postgres database if missing.
    pub async fn url(&self, database: &Database) -> Result<String, StoreError> {
        let name = self.name(database);
        match &self.place {
            DataPlace::SqliteDir(dir) => Ok(format!(
                "sqlite://{}",
                dir.join(format!("{name}.db")).display()
            )),
            DataPlace::PostgresServer(server) => {
                entrega_postgres::ensure_database(&for_service(server, database), &name).await
            }
        }
    }

    /// The full URL of `database`, which must exist: nothing is created, so a role without
    /// `CREATEDB` (or without access to other databases) can use it.
    pub fn existing_url(&self, database: &Database) -> String {
        let name = self.name(database);
        match &self.place {
            DataPlace::SqliteDir(dir) => {
                format!("sqlite://{}", dir.join(format!("{name}.db")).display())
            }
            DataPlace::PostgresServer(server) => {
                with_database(&for_service(server, database), &name)
            }
        }
    }

    /// Connects to `database` (created if missing), without migrating it.
    pub async fn connect(&self, database: &Database) -> Result<Db, StoreError> {
        Db::connect(&self.url(database).await?).await
    }

    /// Connects to the existing `database`, creating nothing.
    pub async fn connect_existing(&self, database: &Database) -> Result<Db, StoreError> {
        Db::connect(&self.existing_url(database)).await
    }
}

/// The placeholder a `--database` URL may hold, replaced by each service's name, so that
/// every service connects as a role of its own:
/// `postgres://km0_{service}@db:5432` → `postgres://km0_inventario@db:5432/km0_inventario`.
pub const SERVICE_PLACEHOLDER: &str = "{service}";

/// `server` with [`SERVICE_PLACEHOLDER`] replaced by the name of `database`'s service.
pub fn for_service(server: &str, database: &Database) -> String {
    server.replace(SERVICE_PLACEHOLDER, database.name)
}

/// Whether a URL names an SQLite database or directory.
pub fn is_sqlite(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// Whether a URL names a PostgreSQL server or database.
pub fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The path part of `sqlite://path` (also `sqlite:path`), without query parameters.
pub fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    Some(rest.split('?').next().unwrap_or(rest))
}

/// Splits `postgres://user@host:port/db?params` into the server URL (`postgres://user@host:port?params`)
/// and the database name, if any.
pub fn split_database(url: &str) -> (String, Option<String>) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (main, query) = match rest.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (rest, None),
    };
    let (authority, name) = match main.split_once('/') {
        Some((a, n)) if !n.is_empty() => (a, Some(n.to_owned())),
        Some((a, _)) => (a, None),
        None => (main, None),
    };
    let mut server = format!("{scheme}://{authority}");
    if let Some(q) = query {
        server.push('?');
        server.push_str(q);
    }
    (server, name)
}

/// Replaces the database name of a Postgres URL.
pub fn with_database(url: &str, name: &str) -> String {
    let (server, _) = split_database(url);
    match server.split_once('?') {
        Some((s, q)) => format!("{s}/{name}?{q}"),
        None => format!("{server}/{name}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls_split_into_server_and_database() {
        assert_eq!(
            split_database("postgres://u@h:5432/km0_broker"),
            (
                "postgres://u@h:5432".to_owned(),
                Some("km0_broker".to_owned())
            )
        );
        assert_eq!(
            split_database("postgres://u@h:5432?sslmode=disable"),
            ("postgres://u@h:5432?sslmode=disable".to_owned(), None)
        );
        assert_eq!(
            with_database("postgres://u@h/x?a=b", "y"),
            "postgres://u@h/y?a=b"
        );
    }

    #[test]
    fn database_places_parse_by_scheme() {
        let pg = Databases::new(DataPlace::parse("postgres://p@h").unwrap());
        assert_eq!(pg.name(&crate::services::pedidos::DATABASE), "km0_pedidos");
        let sqlite = Databases {
            place: DataPlace::parse("sqlite://d").unwrap(),
            prefix: Some("t_".into()),
        };
        assert_eq!(
            sqlite.name(&crate::services::inventario::DATABASE),
            "t_inventario"
        );
        assert_eq!(
            DataPlace::parse("sqlite://km0-data").unwrap(),
            DataPlace::SqliteDir(PathBuf::from("km0-data"))
        );
        assert_eq!(
            DataPlace::parse("postgres://p@127.0.0.1:5432").unwrap(),
            DataPlace::PostgresServer("postgres://p@127.0.0.1:5432".to_owned())
        );
        assert!(DataPlace::parse("mysql://x").is_err());
    }
}
