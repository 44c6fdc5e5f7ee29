//! A three-node RabbitMQ cluster of its own for one test, from Debian's package as
//! `scripts/lib/rabbitmq_cluster.sh` runs one: nodes named for the test, on free ports of
//! 127.0.0.1, run as the rabbitmq user (with its Erlang cookie) with their state in that
//! user's home, finding each other at their first boot. A test may kill a node with SIGKILL
//! and start it again; every node is stopped and its files removed when the cluster is dropped.

#![allow(clippy::panic)]

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::kafka::free_port_besides;

/// Nodes in the cluster.
pub const NODES: u32 = 3;
/// Longest wait for a node to boot and join the others.
const START_WITHIN: Duration = Duration::from_secs(120);

struct Node {
    name: String,
    port: u16,
    management: u16,
    dist: u16,
    dir: PathBuf,
    /// The `rabbitmq-server` started last, reaped when killed.
    child: std::sync::Mutex<Option<Child>>,
}

/// Three RabbitMQ nodes in one cluster.
pub struct RabbitCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

/// The rabbitmq user's uid and gid.
fn rabbitmq_user() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "rabbitmq"])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the rabbitmq user (Debian's rabbitmq-server package)")
    };
    (id("-u"), id("-g"))
}

fn rabbitmqctl(node: &str, args: &[&str]) -> std::process::Output {
    Command::new("rabbitmqctl")
        .args(["-q", "-n", node])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run rabbitmqctl")
}

impl RabbitCluster {
    /// Starts three nodes and waits until they run as one cluster.
    pub fn start() -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let dir = PathBuf::from(format!("/var/lib/rabbitmq/km0-test-{tag}"));
        let mut taken = Vec::new();
        let mut nodes = Vec::new();
        for i in 1..=NODES {
            let mut port = || {
                let p = free_port_besides(&taken);
                taken.push(p);
                p
            };
            let (amqp, management, dist) = (port(), port(), port());
            nodes.push(Node {
                name: format!("km0t{tag}n{i}@localhost"),
                port: amqp,
                management,
                dist,
                dir: dir.join(format!("node-{i}")),
                child: std::sync::Mutex::new(None),
            });
        }
        let peers: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        for node in &nodes {
            fs::create_dir_all(node.dir.join("log")).expect("node dir");
            let mut conf = format!(
                "listeners.tcp.1 = 127.0.0.1:{}\nmanagement.tcp.ip = 127.0.0.1\n\
                 management.tcp.port = {}\ncluster_formation.peer_discovery_backend = \
                 classic_config\n",
                node.port, node.management
            );
            for (i, peer) in peers.iter().enumerate() {
                conf.push_str(&format!(
                    "cluster_formation.classic_config.nodes.{} = {peer}\n",
                    i + 1
                ));
            }
            fs::write(node.dir.join("rabbitmq.conf"), conf).expect("rabbitmq.conf");
            fs::write(
                node.dir.join("enabled_plugins"),
                "[rabbitmq_consistent_hash_exchange,rabbitmq_management].\n",
            )
            .expect("enabled_plugins");
        }
        let chown = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .status()
            .expect("run chown");
        assert!(chown.success(), "chown {}", dir.display());
        let cluster = Self { nodes, dir };
        for i in 1..=NODES {
            cluster.spawn(i);
        }
        for i in 1..=NODES {
            cluster.wait_running(i);
        }
        cluster.wait_clustered();
        cluster
    }

    fn node(&self, i: u32) -> &Node {
        self.nodes
            .get(i as usize - 1)
            .unwrap_or_else(|| panic!("no node {i}"))
    }

    /// The Erlang node name of node `i` (1-based).
    pub fn name(&self, i: u32) -> &str {
        &self.node(i).name
    }

    fn spawn(&self, i: u32) {
        let node = self.node(i);
        let (uid, gid) = rabbitmq_user();
        let out = fs::File::create(node.dir.join("log/server.out")).expect("server.out");
        let err = out.try_clone().expect("server.out");
        let child = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server")
            .env("RABBITMQ_NODENAME", &node.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", node.port.to_string())
            .env("RABBITMQ_DIST_PORT", node.dist.to_string())
            .env("RABBITMQ_CONFIG_FILE", node.dir.join("rabbitmq"))
            .env("RABBITMQ_MNESIA_BASE", node.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", node.dir.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                node.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", node.dir.join("pid"))
            .env("RABBITMQ_CONF_ENV_FILE", "/dev/null")
            .env("HOME", "/var/lib/rabbitmq")
            .uid(uid)
            .gid(gid)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start rabbitmq-server");
        *node.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    }

    /// Waits until node `i` has booted.
    fn wait_running(&self, i: u32) {
        let node = self.node(i);
        let deadline = Instant::now() + START_WITHIN;
        loop {
            // `await_startup` fails at once while the node's VM is not up yet.
            if rabbitmqctl(&node.name, &["await_startup", "--timeout", "60"])
                .status
                .success()
            {
                return;
            }
            let exited = node
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            assert!(
                !exited && Instant::now() < deadline,
                "node {} did not boot: {}",
                node.name,
                fs::read_to_string(node.dir.join("log/server.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until node 1 sees all three nodes running.
    fn wait_clustered(&self) {
        let deadline = Instant::now() + START_WITHIN;
        let running = |i: u32| -> Option<usize> {
            let out = rabbitmqctl(
                self.name(i),
                &["eval", "length(rabbit_nodes:all_running())."],
            );
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        let alive = (1..=NODES).find(|i| self.pid(*i).is_some()).unwrap_or(1);
        while running(alive) != Some(NODES as usize) {
            assert!(
                Instant::now() < deadline,
                "the nodes did not form one cluster within {START_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The process id of node `i`, while it runs.
    fn pid(&self, i: u32) -> Option<i32> {
        let pid: i32 = fs::read_to_string(self.node(i).dir.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// Kills node `i` with SIGKILL (no shutdown) and waits until it is gone.
    pub fn kill(&self, i: u32) {
        if let Some(pid) = self.pid(i) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.pid(i).is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let child = self
            .node(i)
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on its state and waits until it is back in the cluster.
    pub fn restart(&self, i: u32) {
        self.spawn(i);
        self.wait_running(i);
        self.wait_clustered();
    }

    /// The node hosting the leaders of most of `queues` (quorum queues), by node number.
    pub fn busiest_leader(&self, queues: &[String]) -> u32 {
        let out = rabbitmqctl(
            self.name(1),
            &["list_queues", "name", "leader", "--no-table-headers"],
        );
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        (1..=NODES)
            .max_by_key(|i| {
                listing
                    .lines()
                    .filter(|line| {
                        let mut cols = line.split_whitespace();
                        let (Some(queue), Some(leader)) = (cols.next(), cols.next()) else {
                            return false;
                        };
                        queues.iter().any(|q| q == queue) && leader == self.name(*i)
                    })
                    .count()
            })
            .unwrap_or(1)
    }

    /// `amqp://guest:guest@<every node>/?management=<node 1's API>`, for km0's `--broker`.
    pub fn url(&self) -> String {
        self.url_from(1)
    }

    /// [`RabbitCluster::url`] with node `first` named first, so a client connects there
    /// while it runs.
    pub fn url_from(&self, first: u32) -> String {
        let mut hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let first = usize::try_from(first).unwrap_or(1).clamp(1, hosts.len()) - 1;
        hosts.rotate_left(first);
        format!(
            "amqp://guest:guest@{}?management=http://127.0.0.1:{}",
            hosts.join(","),
            self.node(1).management
        )
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        for i in 1..=NODES {
            self.kill(i);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
