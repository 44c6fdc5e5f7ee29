//! The `km0` binary as separate processes, the way crash tests drive it: start a component,
//! wait for its ready line, talk to it, stop it with a signal.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

struct Km0 {
    child: Child,
    ready: String,
}

impl Km0 {
    /// Starts `km0 <args>` on the data in `dir` and waits (bounded) for its ready line.
    fn start(dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_km0"))
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            // The seed\'s first flow unless a test asks for the saga (`--saga` wins).
            .env("KM0_NO_SAGA", "true")
            .arg("--database")
            .arg(format!("sqlite://{}", dir.display()))
            .arg("--broker")
            .arg(format!("sqlite://{}", dir.join("broker.db").display()))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn km0");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("km0 ready") {
                    let _ = tx.send(line);
                }
            }
        });
        let ready = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("km0 printed no ready line within 30s");
        Self { child, ready }
    }

    fn field(&self, name: &str) -> Option<String> {
        self.ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("km0 did not stop within 20s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn temp_dir() -> PathBuf {
    std::env::temp_dir().join(format!("km0-cli-{}", uuid::Uuid::new_v4().simple()))
}

#[tokio::test]
async fn run_pedidos_serves_on_the_announced_port_and_stops_cleanly_on_sigterm() {
    let dir = temp_dir();
    let km0 = Km0::start(
        &dir,
        &[
            "run",
            "pedidos",
            "--http",
            "127.0.0.1:0",
            "--instance",
            "p1",
        ],
    );
    assert!(km0.ready.contains("instance=p1"), "{}", km0.ready);
    let addr = km0
        .field("pedidos")
        .expect("pedidos address in the ready line");

    let client = reqwest::Client::new();
    let order = json!({"id": "P-CLI-1", "cliente": "ana", "mercado": "girona",
                       "lineas": [{"producto": "calabacin", "cantidad": 1, "precio_centimos": 220}]});
    let response = client
        .post(format!("http://{addr}/pedidos"))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let status = km0.terminate();
    assert!(status.success(), "exit status {status}");

    // The order outlived the process: it is in the database the next process opens.
    let out = Command::new(env!("CARGO_BIN_EXE_km0"))
        // Test deployments migrate as they open (production runs `km0 migrate` first).
        .env("KM0_MIGRATE", "true")
        // The seed\'s first flow unless a test asks for the saga (`--saga` wins).
        .env("KM0_NO_SAGA", "true")
        .arg("--database")
        .arg(format!("sqlite://{}", dir.display()))
        .arg("--broker")
        .arg(format!("sqlite://{}", dir.join("broker.db").display()))
        .args(["outbox", "status", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        status["pending"], 1,
        "the order's event waits in the outbox: {status}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The embedded default is zero setup: `km0 up` in an empty folder, with no flag and no
/// `KM0_*` variable, creates and migrates its SQLite files and takes orders.
#[tokio::test]
async fn up_in_an_empty_folder_sets_the_embedded_default_up_itself() {
    let dir = temp_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_km0"))
        .current_dir(&dir)
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .env_remove("KM0_DB_PREFIX")
        .env_remove("KM0_MIGRATE")
        .args(["up", "--http", "127.0.0.1:0", "--pasarela", "127.0.0.1:0"])
        .args(["--ops", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn km0");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("km0 ready") {
                let _ = tx.send(line);
            }
        }
    });
    let Ok(ready) = rx.recv_timeout(Duration::from_secs(60)) else {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "km0 up printed no ready line: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let km0 = Km0 { child, ready };
    let addr = km0
        .field("pedidos")
        .expect("pedidos address in the ready line");
    let order = json!({"id": "P-EMPTY-1", "cliente": "ana", "mercado": "girona",
        "tarjeta": "tok_visa",
        "direccion_entrega": {"ciudad": "Madrid", "codigo_postal": "28001", "calle": "Gran Via 1"},
        "lineas": [{"producto": "calabacin", "cantidad": 1, "precio_centimos": 220}]});
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/pedidos"))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert!(km0.terminate().success());
    // The order is a row of the pedidos file km0 made in the folder.
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.join("km0-data").join("pedidos.db").display()
    ))
    .await
    .unwrap();
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM pedidos WHERE id = 'P-EMPTY-1'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(count, 1);
    db.close().await;
    let _ = std::fs::remove_dir_all(dir);
}
