//! Fresh databases for tests: an SQLite file in its own temporary directory, or a PostgreSQL
//! database with a random name on the server of `ENTREGA_TEST_PG`. Crash tests add real `km0`
//! processes ([`process`]) and the database state they assert on ([`state`]).

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

pub mod amqp;
pub mod amqp_cluster;
pub mod amqp_state;
pub mod cloudevents;
pub mod coverage;
pub mod delivery_order;
pub mod kafka;
pub mod kafka_cluster;
pub mod kafka_ns;
pub mod kafka_state;
pub mod ledger;
pub mod own_pg;
pub mod pg_pair;
pub mod process;
pub mod proxy;
pub mod rpc_load;
pub mod state;
pub mod stream;
pub mod tls;

use std::path::PathBuf;

use entrega::Db;

/// Server used by PostgreSQL tests.
pub fn pg_server() -> String {
    std::env::var("ENTREGA_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A database that exists for one test.
pub struct TestDb {
    /// The connected database.
    pub db: Db,
    /// Its URL, to open more connections.
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Dir(PathBuf),
    PgDatabase(String),
}

impl TestDb {
    /// A new SQLite database file.
    pub async fn sqlite() -> Self {
        let dir = std::env::temp_dir().join(format!("km0-test-{}", uuid::Uuid::new_v4().simple()));
        let url = format!("sqlite://{}", dir.join("test.db").display());
        let db = Db::connect(&url).await.expect("sqlite connect");
        Self {
            db,
            url,
            cleanup: Cleanup::Dir(dir),
        }
    }

    /// A new PostgreSQL database on [`pg_server`].
    pub async fn postgres() -> Self {
        let name = format!("entrega_t_{}", uuid::Uuid::new_v4().simple());
        let url = entrega_postgres::ensure_database(&pg_server(), &name)
            .await
            .expect("create test database");
        let db = Db::connect(&url).await.expect("postgres connect");
        Self {
            db,
            url,
            cleanup: Cleanup::PgDatabase(name),
        }
    }

    /// A fresh database of the named backend (`sqlite` or `postgres`).
    pub async fn of(backend: &str) -> Self {
        match backend {
            "postgres" => Self::postgres().await,
            _ => Self::sqlite().await,
        }
    }

    /// Closes the database and removes it.
    pub async fn remove(self) {
        self.db.close().await;
        match self.cleanup {
            Cleanup::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::PgDatabase(name) => {
                if let Ok(admin) = sqlx::PgPool::connect(&format!("{}/postgres", pg_server())).await
                {
                    let _ =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                            .execute(&admin)
                            .await;
                    admin.close().await;
                }
            }
        }
    }
}

/// The PostgreSQL databases whose names match the `LIKE` pattern `pattern`.
pub async fn databases_like(pattern: &str) -> Vec<String> {
    let admin = sqlx::PgPool::connect(&format!("{}/postgres", pg_server()))
        .await
        .expect("connect to postgres");
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname LIKE $1")
            .bind(pattern)
            .fetch_all(&admin)
            .await
            .expect("list databases");
    admin.close().await;
    names
}

/// The `km0 ready` line `child` prints on its piped stdout, within `within`; `None` if it
/// printed none by then. Its stdout is read to the end on a thread of its own, so the child
/// never blocks on a full pipe.
pub fn ready_line(child: &mut std::process::Child, within: std::time::Duration) -> Option<String> {
    use std::io::BufRead as _;
    let stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("km0 ready") {
                let _ = tx.send(line);
            }
        }
    });
    rx.recv_timeout(within).ok()
}

/// A whole deployment on fresh databases of `backend`: a temporary directory on SQLite,
/// `entrega_t_<uuid>_*` databases on PostgreSQL. Remove it with `System::destroy`.
pub fn test_system(backend: &str) -> km0::wiring::System {
    use km0::wiring::config::{DataPlace, Databases};
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (databases, broker) = match backend {
        "postgres" => (
            Databases {
                place: DataPlace::PostgresServer(pg_server()),
                prefix: Some(format!("entrega_t_{id}_")),
            },
            format!("{}/entrega_t_{id}_broker", pg_server()),
        ),
        _ => {
            let dir = std::env::temp_dir().join(format!("km0-test-{id}"));
            let broker = format!("sqlite://{}", dir.join("broker.db").display());
            (Databases::new(DataPlace::SqliteDir(dir)), broker)
        }
    };
    km0::wiring::System::new(databases, broker).with_lease_ttl(std::time::Duration::from_secs(2))
}

/// `km0` on the embedded default in `dir` (its SQLite files and the SQLite log there),
/// migrating its databases as it opens them (production runs `km0 migrate` first); the caller
/// adds the command.
pub fn embedded_km0(dir: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_km0"));
    command
        .env("KM0_MIGRATE", "true")
        .arg("--database")
        .arg(format!("sqlite://{}", dir.display()))
        .arg("--broker")
        .arg(format!("sqlite://{}", dir.join("broker.db").display()));
    command
}

/// Runs `km0 <args>` to completion with none of km0's variables from the environment (and
/// `env` set): whether it succeeded, and its stdout followed by its stderr.
pub fn run_km0(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_km0"))
        .args(args)
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .env_remove("KM0_DB_PREFIX")
        .env_remove("KM0_MIGRATE")
        .envs(env.iter().copied())
        .output()
        .expect("run km0");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Prints `report` and writes it to `target/km0-measurements/<name>.json`.
pub fn write_measurements(name: &str, report: &serde_json::Value) {
    eprintln!("{name}: {report}");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
        .join("km0-measurements");
    std::fs::create_dir_all(&dir).expect("measurements directory");
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(report).expect("json"),
    )
    .expect("write measurements");
}

/// The median of the row named `name` in a `km0 bench --json` report.
pub fn report_median(report: &serde_json::Value, name: &str) -> f64 {
    report["rows"]
        .as_array()
        .expect("the report's rows")
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("no row `{name}` in {report}"))["median"]
        .as_f64()
        .expect("a median")
}
