//! The `km0` binary as separate processes, the way crash tests drive it: start a component,
//! wait for its ready line, talk to it, stop it with a signal.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

struct Km0 {
    child: Child,
    ready: String,
}

/// A test that fails mid-way must not leave its km0 running.
impl Drop for Km0 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Km0 {
    /// Starts `km0 <args>` on the data in `dir` and waits (bounded) for its ready line.
    fn start(dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_km0"))
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            // The seed's first flow unless a test asks for the saga (`--saga` wins).
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
        let ready = crate::common::ready_line(&mut child, Duration::from_secs(30))
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
        // The seed's first flow unless a test asks for the saga (`--saga` wins).
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

#[test]
fn km0_lab_run_all_prints_every_ledger_and_succeeds_when_each_point_is_shown() {
    let server = |var: &str, default: &str| std::env::var(var).unwrap_or(default.to_owned());
    let out = Command::new(env!("CARGO_BIN_EXE_km0"))
        .args(["lab", "run", "all", "--json", "--seed", "3"])
        .env(
            "KM0_LAB_KAFKA",
            server("ENTREGA_TEST_KAFKA", "127.0.0.1:9092"),
        )
        .env(
            "KM0_LAB_RABBITMQ",
            server("ENTREGA_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672"),
        )
        .env(
            "KM0_LAB_REDIS",
            server("ENTREGA_TEST_REDIS", "redis://127.0.0.1:6379"),
        )
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["seed"], 3);
    let scenarios = report["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), km0::lab::scenarios().len());
    for s in scenarios {
        assert_eq!(s["shown"], true, "{s}");
        assert!(s["naive"]["placed"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["pattern"]["placed"], s["pattern"]["applied"], "{s}");
    }
    // Nothing but the report on stdout; the lab's own logging stays quiet.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A scenario whose server does not answer is skipped, with the reason, not failed.
    let away = Command::new(env!("CARGO_BIN_EXE_km0"))
        .args([
            "lab",
            "run",
            "lock-ttl",
            "--json",
            "--redis",
            "redis://127.0.0.1:1",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(away.status.success(), "{away:?}");
    let report: serde_json::Value = serde_json::from_slice(&away.stdout).unwrap();
    let skipped = report["scenarios"][0]["skipped"].as_str().unwrap();
    assert!(
        skipped.contains("Redis does not answer at 127.0.0.1:1"),
        "{skipped}"
    );
    assert_eq!(report["scenarios"][0]["shown"], false);
    let unknown = Command::new(env!("CARGO_BIN_EXE_km0"))
        .args(["lab", "run", "no-such-scenario"])
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("km0 lab list"));
}
