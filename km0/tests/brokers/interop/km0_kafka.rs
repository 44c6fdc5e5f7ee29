//! km0 as separate processes on PostgreSQL with a Kafka-protocol broker, and the databases a
//! test creates, dropped when it ends.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::common;
use crate::common::kafka_ns::KafkaNamespace;

pub struct Databases {
    names: Vec<String>,
}

impl Databases {
    pub fn new() -> Self {
        Self { names: Vec::new() }
    }

    /// Creates (if missing) database `name`, to be dropped with the rest; its URL.
    pub async fn create(&mut self, name: &str) -> String {
        self.names.push(name.to_owned());
        entrega_postgres::ensure_database(&common::pg_server(), name)
            .await
            .expect("create database")
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.names);
        // On its own thread: this runs inside the test's runtime, which cannot block.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let admin = format!("{}/postgres", common::pg_server());
                let Ok(pool) = PgPool::connect(&admin).await else {
                    return;
                };
                for name in names {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = sqlx::query(&sql).execute(&pool).await;
                }
                pool.close().await;
            });
        })
        .join();
    }
}

/// A km0 deployment on PostgreSQL (databases `<prefix>pedidos`, `<prefix>inventario`) whose
/// broker is a Kafka-protocol broker.
pub struct Km0Kafka {
    prefix: String,
    broker: String,
    logs: PathBuf,
}

impl Km0Kafka {
    pub fn new(broker: &KafkaNamespace) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let logs = std::env::temp_dir().join(format!("km0-interop-logs-{id}"));
        std::fs::create_dir_all(&logs).expect("log directory");
        eprintln!("km0 process logs in {}", logs.display());
        Self {
            prefix: format!("entrega_t_{id}_"),
            broker: broker.url(),
            logs,
        }
    }

    /// The database of `service`, registered in `dbs` for dropping; a pool on it.
    pub async fn db(&self, dbs: &mut Databases, service: &str) -> PgPool {
        let url = dbs.create(&format!("{}{service}", self.prefix)).await;
        PgPool::connect(&url).await.expect("connect")
    }

    /// The URL of `service`'s database (made by [`Km0Kafka::db`]).
    pub async fn url(&self, service: &str) -> String {
        entrega_postgres::ensure_database(
            &common::pg_server(),
            &format!("{}{service}", self.prefix),
        )
        .await
        .expect("database URL")
    }

    /// `km0 run <component>`, waiting (bounded) for its ready line.
    pub async fn start(&self, component: &str) -> Km0 {
        self.start_with(component, &[]).await
    }

    /// [`Km0Kafka::start`] with `env` set in the process.
    pub async fn start_with(&self, component: &str, env: &[(&str, &str)]) -> Km0 {
        let log = std::fs::File::create(self.logs.join(format!("{component}.log"))).expect("log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_km0"))
            .envs(env.iter().copied())
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            // The seed's first flow unless a test asks for the saga (`--saga` wins).
            .env("KM0_NO_SAGA", "true")
            .args([
                "--database",
                &common::pg_server(),
                "--db-prefix",
                &self.prefix,
            ])
            .args(["--broker", &self.broker, "--lease-ttl-ms", "2000"])
            .args(["run", component, "--instance", component])
            .args(["--http", "127.0.0.1:0"])
            .env_remove("KM0_DATABASE")
            .env_remove("KM0_BROKER")
            .env_remove("KM0_DB_PREFIX")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn km0");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("km0 ready") {
                    return Some(line);
                }
            }
            None
        })
        .await;
        let Ok(Some(ready)) = ready else {
            panic!(
                "km0 {component} did not get ready; see {}",
                self.logs.display()
            )
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Km0 { child, ready }
    }
}

impl Drop for Km0Kafka {
    /// The process logs are kept when the test failed, for reading.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

/// A running km0 process.
pub struct Km0 {
    child: Child,
    ready: String,
}

impl Km0 {
    /// The pedidos HTTP address from the ready line.
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix("pedidos="))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no pedidos address in `{}`", self.ready))
    }

    /// SIGTERM; asserts a clean exit within 30 s.
    pub async fn terminate(mut self) {
        let pid = self.child.id().expect("running").to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().await;
        assert!(sent.expect("kill").success(), "could not signal km0");
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("km0 stops within 30s of SIGTERM")
            .expect("wait");
        assert!(status.success(), "km0 did not stop cleanly: {status}");
    }
}
