//! A PostgreSQL server of a test's own, so the test may restart or crash it without
//! disturbing the others: a cluster made with `initdb` in a temporary directory (owned by the
//! `postgres` user, as the server refuses to run as root), on a free port of 127.0.0.1,
//! trusting loopback, stopped and removed when dropped.

#![allow(clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The newest server installed from Debian's packages.
pub fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server installed under /usr/lib/postgresql (scripts/test)")
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("postgres").exists())
        .collect();
    versions.sort();
    versions.pop().expect("a PostgreSQL server binary")
}

fn as_postgres(program: &Path, args: &[&str]) {
    as_postgres_logged(program, args, None);
}

/// [`as_postgres`], with the end of the server's log in the failure.
pub fn as_postgres_logged(program: &Path, args: &[&str], log: Option<&Path>) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .output()
        .expect("run runuser");
    if !out.status.success() {
        let tail = log
            .and_then(|log| std::fs::read_to_string(log).ok())
            .map(|text| {
                // Without the refusals of clients reconnecting meanwhile.
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| !l.contains("the database system is shutting down"))
                    .collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            })
            .unwrap_or_default();
        panic!(
            "{} {args:?}: {}{}\nserver log:\n{tail}",
            program.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A new directory `<tmp>/<prefix>-<uuid>` owned by the `postgres` user, for servers' data
/// and sockets.
pub fn postgres_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("server dir");
    let chown = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .expect("run chown");
    assert!(chown.success(), "chown {}", dir.display());
    dir
}

/// A port of 127.0.0.1 nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A running server owned by one test.
pub struct OwnPostgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl OwnPostgres {
    /// Makes and starts a cluster; returns once it accepts connections.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = postgres_dir("km0-pg");
        let data = dir.join("data");
        as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                &data.to_string_lossy(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        let port = free_port();
        let server = Self { dir, bin, port };
        server.pg_ctl(&["start"]);
        server
    }

    fn pg_ctl(&self, action: &[&str]) {
        let data = self.dir.join("data");
        let log = self.dir.join("server.log");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off \
             -c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10",
            self.port,
            self.dir.display()
        );
        let mut args = vec!["-D", data.to_str().expect("utf-8 path"), "-w", "-t", "60"];
        args.extend_from_slice(action);
        if action.contains(&"start") || action.contains(&"restart") {
            args.extend(["-l", log.to_str().expect("utf-8 path"), "-o", &options]);
        }
        as_postgres_logged(&self.bin.join("pg_ctl"), &args, Some(&log));
    }

    /// `postgres://postgres@127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// Restarts the server: `fast` lets it shut down cleanly (open sessions are ended),
    /// `immediate` kills it without a checkpoint, so it starts with crash recovery.
    pub fn restart(&self, mode: &str) {
        self.pg_ctl(&["-m", mode, "stop"]);
        self.pg_ctl(&["start"]);
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args([
                "-D",
                &data.to_string_lossy(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
