//! A deployment's databases made and unmade: `km0 migrate` (every database, with
//! least-privileged roles on PostgreSQL), and the databases of their own that a fresh demo
//! or benchmark run makes and removes.

use std::path::PathBuf;

use anyhow::Context as _;
use entrega::db::query;
use entrega::Db;
use entrega_core::StoreError;

use super::component::databases;
use super::config::{
    is_postgres, split_database, sqlite_path, with_database, BrokerUrl, BrokerUrlError, DataPlace,
    Databases,
};
use super::settings::SchemaMode;
use super::System;

/// Grants `role` least privilege on `db` (PostgreSQL only).
async fn grant(db: &Db, role: &str) -> anyhow::Result<()> {
    match db.postgres() {
        Some(pool) => Ok(entrega_postgres::grant_service_role(pool, role).await?),
        None => anyhow::bail!(
            "service roles are PostgreSQL's; an SQLite file is guarded by its file permissions"
        ),
    }
}

impl System {
    /// Creates and migrates every database of the deployment (the broker's too, when it is
    /// the log transport in a database), whatever this deployment's [`SchemaMode`]; with
    /// `roles` on PostgreSQL, then makes each service's role (named as its database) the
    /// least-privileged user of its database ([`entrega_postgres::grant_service_role`]), and
    /// the log database's role that of the log. Returns what it migrated.
    pub async fn migrate(&self, roles: bool) -> anyhow::Result<Vec<String>> {
        let owner = self.clone().with_schema(SchemaMode::Migrate);
        let mut done = Vec::new();
        for database in databases() {
            let db = owner
                .open(database)
                .await
                .with_context(|| format!("migrating {}", database.name))?;
            let granted = if roles {
                let role = self.databases.name(database);
                let granted = grant(&db, &role).await;
                granted
                    .with_context(|| format!("granting {role}"))
                    .map(|()| format!("{} (role {role})", database.name))
            } else {
                Ok(database.name.to_owned())
            };
            db.close().await;
            done.push(granted?);
        }
        let kind = self.broker_kind()?;
        if !kind.is_server() {
            let broker = owner.broker().await.context("migrating the log broker")?;
            broker.close().await;
            match (roles, super::broker::log_database(&kind)) {
                (true, Some(name)) => {
                    let url = match &kind {
                        BrokerUrl::PostgresLog(url) => with_database(url, &name),
                        _ => String::new(),
                    };
                    let db = Db::connect(&url)
                        .await
                        .context("opening the log database")?;
                    let granted = grant(&db, &name).await;
                    db.close().await;
                    granted.with_context(|| format!("granting {name}"))?;
                    done.push(format!("broker (role {name})"));
                }
                _ => done.push("broker".to_owned()),
            }
        }
        Ok(done)
    }

    /// The same deployment on databases of its own, named after `run`: a `demo-<run>`
    /// directory on SQLite, `<prefix>demo<run>_*` databases on PostgreSQL.
    pub fn fresh(&self, run: &str) -> Result<Self, BrokerUrlError> {
        let databases = match &self.databases.place {
            DataPlace::SqliteDir(dir) => Databases {
                place: DataPlace::SqliteDir(dir.join(format!("demo-{run}"))),
                prefix: self.databases.prefix.clone(),
            },
            DataPlace::PostgresServer(server) => Databases {
                place: DataPlace::PostgresServer(server.clone()),
                prefix: Some(format!(
                    "{}demo{run}_",
                    self.databases.prefix.as_deref().unwrap_or("km0_")
                )),
            },
        };
        let broker_url = if self.broker_kind()?.is_server() {
            // Topics, groups and queues live on the broker, shared with whatever else uses
            // it: the run gets names of its own, under a namespace.
            with_param(&self.broker_url, "namespace", &demo_namespace(run))
        } else if is_postgres(&self.broker_url) {
            let name = split_database(&self.broker_url)
                .1
                .unwrap_or_else(|| "km0_broker".to_owned());
            with_database(&self.broker_url, &format!("{name}_demo{run}"))
        } else {
            let path = sqlite_path(&self.broker_url)
                .map(PathBuf::from)
                .ok_or_else(|| BrokerUrlError::UnknownScheme {
                    url: self.broker_url.clone(),
                })?;
            let dir = path.parent().map(PathBuf::from).unwrap_or_default();
            let file = path
                .file_name()
                .map(PathBuf::from)
                .unwrap_or_else(|| "broker.db".into());
            format!(
                "sqlite://{}",
                dir.join(format!("demo-{run}")).join(file).display()
            )
        };
        let mut settings = self.settings.clone();
        // A fresh run makes its own databases.
        settings.schema = SchemaMode::Migrate;
        Ok(Self {
            databases,
            broker_url,
            settings,
        })
    }

    /// Drops the replication slots of this deployment's PostgreSQL databases that nobody
    /// streams from: a failed demo run keeps its databases as evidence, but a slot left
    /// behind would hold the server's WAL from then on. Returns how many were dropped.
    pub async fn drop_idle_slots(&self) -> Result<u64, StoreError> {
        let DataPlace::PostgresServer(server) = &self.databases.place else {
            return Ok(0);
        };
        let names: Vec<String> = databases()
            .into_iter()
            .map(|d| self.databases.name(d))
            .collect();
        let admin = Db::connect(&with_database(server, "postgres")).await?;
        let dropped = admin
            .execute(
                query(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE NOT active AND database = ANY($1)",
                )
                .bind(entrega::db::TextList(names)),
            )
            .await;
        admin.close().await;
        dropped
    }

    /// Removes every database of this deployment (fresh demo runs), once nothing uses them:
    /// the SQLite files (and their directory when left empty) or the PostgreSQL databases.
    pub async fn destroy(&self) -> Result<(), StoreError> {
        let mut sqlite_files = Vec::new();
        let mut pg_databases = Vec::new();
        for database in databases() {
            let name = self.databases.name(database);
            match &self.databases.place {
                DataPlace::SqliteDir(dir) => sqlite_files.push(dir.join(format!("{name}.db"))),
                DataPlace::PostgresServer(server) => pg_databases.push((server.clone(), name)),
            }
        }
        match BrokerUrl::parse(&self.broker_url) {
            Ok(BrokerUrl::PostgresLog(url)) => {
                if let (server, Some(name)) = split_database(&url) {
                    pg_databases.push((server, name));
                }
            }
            Ok(BrokerUrl::SqliteLog(url)) => {
                if let Some(path) = sqlite_path(&url) {
                    sqlite_files.push(PathBuf::from(path));
                }
            }
            // On a shared broker, only what is under the run's namespace is its own.
            Ok(BrokerUrl::Kafka(url, kafka)) if !kafka.namespace.is_none() => {
                remove_namespace(&url).await?;
            }
            Ok(BrokerUrl::Amqp(url, amqp)) if !amqp.namespace.is_none() => {
                remove_namespace(&url).await?;
            }
            Ok(BrokerUrl::Kafka(..) | BrokerUrl::Amqp(..)) | Err(_) => {}
        }
        for file in &sqlite_files {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::rejected(e)),
                }
            }
        }
        for file in &sqlite_files {
            if let Some(dir) = file.parent() {
                // Only succeeds when empty: never removes anything km0 did not create.
                let _ = std::fs::remove_dir(dir);
            }
        }
        for (server, name) in pg_databases {
            let admin = Db::connect(&with_database(&server, "postgres")).await?;
            // FORCE: pools of this process may still hold idle connections.
            let sql = format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                name.replace('"', "\"\"")
            );
            let dropped = admin.execute(query(sql)).await;
            admin.close().await;
            dropped?;
        }
        Ok(())
    }
}

/// The namespace of fresh run `run` on a shared broker.
pub fn demo_namespace(run: &str) -> String {
    format!("km0-demo-{run}.")
}

/// `url` with `name=value` added to its query.
fn with_param(url: &str, name: &str, value: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{name}={value}")
}

/// How long removing a namespace is tried again: a group is deleted only once the broker
/// has seen its last member leave, which a consumer stopped a moment ago (or killed, until
/// its session times out) may not have yet.
const REMOVE_NAMESPACE_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Deletes what is under the namespace of the shared broker at `url`, trying again for
/// [`REMOVE_NAMESPACE_WITHIN`] while the broker refuses (a group with a member).
async fn remove_namespace(url: &str) -> Result<(), StoreError> {
    let broker = entrega::Broker::connect(url, std::time::Duration::from_secs(10))
        .await
        .map_err(StoreError::rejected)?;
    let removed = broker
        .remove_namespace_within(REMOVE_NAMESPACE_WITHIN)
        .await;
    broker.close().await;
    removed.map(drop).map_err(StoreError::rejected)
}
