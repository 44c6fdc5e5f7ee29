//! A PostgreSQL primary with a streaming standby of a test's own, both on 127.0.0.1: the
//! primary made with `initdb`, the standby with `pg_basebackup` from it, and replication
//! synchronous (`synchronous_standby_names = '*'`), so a transaction committed on the
//! primary has reached the standby's disk. [`PgPair::url`] names both, as a service would be
//! given them; the test kills the primary with SIGKILL and promotes the standby.

#![allow(clippy::panic)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::own_pg::{as_postgres_logged, bin_dir, free_port, postgres_dir};

/// One server of the pair.
struct Node {
    data: PathBuf,
    log: PathBuf,
    port: u16,
}

/// The pair; both servers are stopped and removed when dropped.
pub struct PgPair {
    dir: PathBuf,
    bin: PathBuf,
    nodes: [Node; 2],
}

impl PgPair {
    /// Makes the primary, starts it, makes the standby from it and starts it; returns once
    /// the standby streams synchronously.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = postgres_dir("km0-pgpair");
        let node = |name: &str| Node {
            data: dir.join(name),
            log: dir.join(format!("{name}.log")),
            port: free_port(),
        };
        let pair = Self {
            nodes: [node("primary"), node("standby")],
            bin,
            dir,
        };
        let primary = &pair.nodes[0];
        pair.run(
            "initdb",
            &[
                "-D",
                &path(&primary.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
            None,
        );
        pair.pg_ctl(0, &["start"]);
        let standby = &pair.nodes[1];
        pair.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &path(&standby.data),
                "-X",
                "stream",
                "-R",
                "--no-sync",
            ],
            None,
        );
        pair.pg_ctl(1, &["start"]);
        pair.wait_synchronous();
        pair
    }

    fn run(&self, program: &str, args: &[&str], log: Option<&PathBuf>) {
        as_postgres_logged(&self.bin.join(program), args, log.map(PathBuf::as_path));
    }

    /// `pg_ctl` on node `i`; a start gets the pair's settings. Both nodes get the same ones:
    /// the standby's `synchronous_standby_names` matters once it is promoted, and there it
    /// names no standby that could connect, so it is left empty on it.
    fn pg_ctl(&self, i: usize, action: &[&str]) {
        let node = &self.nodes[i];
        let synchronous = if i == 0 { "'*'" } else { "''" };
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off \
             -c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10 \
             -c hot_standby=on -c synchronous_standby_names={synchronous} \
             -c wal_sender_timeout=5s -c wal_receiver_timeout=5s",
            node.port,
            self.dir.display()
        );
        let data = path(&node.data);
        let log = path(&node.log);
        let mut args = vec!["-D", &data, "-w", "-t", "60"];
        args.extend_from_slice(action);
        if action.contains(&"start") {
            args.extend(["-l", &log, "-o", &options]);
        }
        self.run("pg_ctl", &args, Some(&node.log));
    }

    fn wait_synchronous(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join("psql"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.nodes[0].port.to_string(),
                    "-U",
                    "postgres",
                    "-Atc",
                    "SELECT sync_state FROM pg_stat_replication",
                ])
                .output()
                .expect("run psql");
            if String::from_utf8_lossy(&out.stdout).trim() == "sync" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby is not streaming synchronously: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Both servers, primary first, as a libpq URL naming several hosts:
    /// `postgres://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>`, with the sessions a
    /// writer needs.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// `host:port` of the primary, then of the standby.
    pub fn addresses(&self) -> [String; 2] {
        [0, 1].map(|i| format!("127.0.0.1:{}", self.nodes[i].port))
    }

    /// Kills the primary's postmaster and every process of it with SIGKILL, as a machine
    /// that died: no shutdown checkpoint, no goodbye to the clients or to the standby.
    pub fn kill_primary(&self) {
        let pid_file = self.nodes[0].data.join("postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next().map(str::to_owned))
            .unwrap_or_else(|| panic!("no {}", pid_file.display()));
        // Its children first named, then all killed at once: once the postmaster is gone they
        // are orphans no longer found by parent.
        let children = Command::new("pgrep")
            .args(["-P", &pid])
            .output()
            .expect("run pgrep");
        let mut victims = vec![pid];
        victims.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        let killed = Command::new("kill")
            .arg("-9")
            .args(&victims)
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -9 {victims:?}");
    }

    /// Promotes the standby; returns once it takes writes.
    pub fn promote_standby(&self) {
        self.pg_ctl(1, &["promote"]);
    }
}

fn path(p: &std::path::Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"))
                .args(["-D", &path(&node.data), "-m", "immediate", "-w", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
