//! A three-node Apache Kafka cluster of its own for one test: KRaft, every node both broker
//! and controller, from `scripts/kafka/cluster.properties.in` (replication factor 3,
//! `min.insync.replicas` 2, no unclean leader election) on free ports of 127.0.0.1, run from
//! the jars `scripts/lib/kafka.sh` caches. A test may kill a node with SIGKILL and restart it
//! on its log dir; it can ask which node leads each partition of a topic and which is the
//! active controller. Every node is killed and its files removed when the cluster is dropped.

#![allow(clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;

use super::kafka::{cluster_id, free_port_besides, kafka_java, kafka_libs, repo_root, tail};

/// Longest wait for a node to answer a Metadata request listing the whole cluster.
const START_WITHIN: Duration = Duration::from_secs(120);
/// Nodes in the cluster.
pub const NODES: u32 = 3;

struct Node {
    id: u32,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// Three nodes, each broker and controller.
pub struct KafkaCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl KafkaCluster {
    /// Formats and starts three nodes and waits until each lists all three brokers.
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "km0-kafka-cluster-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let mut taken = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..NODES {
            let port = free_port_besides(&taken);
            taken.push(port);
            let controller = free_port_besides(&taken);
            taken.push(controller);
            ports.push((port, controller));
        }
        let voters = ports
            .iter()
            .enumerate()
            .map(|(i, (_, c))| format!("{}@127.0.0.1:{c}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let template = fs::read_to_string(repo_root().join("scripts/kafka/cluster.properties.in"))
            .expect("scripts/kafka/cluster.properties.in");
        let id = cluster_id();
        let mut nodes = Vec::new();
        for (i, (port, controller)) in ports.iter().enumerate() {
            let node_id = i as u32 + 1;
            let node_dir = dir.join(format!("node-{node_id}"));
            fs::create_dir_all(node_dir.join("data")).expect("node dir");
            let properties = template
                .replace("@NODE_ID@", &node_id.to_string())
                .replace("@PORT@", &port.to_string())
                .replace("@CONTROLLER_PORT@", &controller.to_string())
                .replace("@VOTERS@", &voters)
                .replace("@DATA_DIR@", &node_dir.join("data").to_string_lossy());
            fs::write(node_dir.join("server.properties"), properties).expect("properties");
            let format = kafka_java(&node_dir, "format.log", "256m")
                .args(["kafka.tools.StorageTool", "format", "-t", &id, "-c"])
                .arg(node_dir.join("server.properties"))
                .status()
                .expect("run kafka.tools.StorageTool");
            assert!(
                format.success(),
                "formatting node {node_id} failed: {}",
                tail(&node_dir.join("format.log"))
            );
            nodes.push(Node {
                id: node_id,
                port: *port,
                dir: node_dir,
                child: None,
            });
        }
        let mut cluster = Self { nodes, dir };
        // A quorum needs two voters: every node starts before any is waited for.
        for id in 1..=NODES {
            cluster.spawn(id);
        }
        for id in 1..=NODES {
            cluster.wait_ready(id);
        }
        cluster
    }

    fn node(&mut self, id: u32) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn spawn(&mut self, id: u32) {
        let node = self.node(id);
        assert!(node.child.is_none(), "node {id} is running");
        let child = kafka_java(&node.dir, "broker.log", "384m")
            .arg("kafka.Kafka")
            .arg(node.dir.join("server.properties"))
            .spawn()
            .expect("start kafka.Kafka");
        node.child = Some(child);
    }

    /// Waits until node `id` answers a Metadata request listing all three brokers.
    fn wait_ready(&mut self, id: u32) {
        let deadline = Instant::now() + START_WITHIN;
        let node = self.node(id);
        let log = node.dir.join("broker.log");
        loop {
            let probe = Command::new("python3")
                .arg(repo_root().join("scripts/kafka/probe.py"))
                .arg(format!("127.0.0.1:{}", node.port))
                .stderr(Stdio::null())
                .output()
                .expect("run scripts/kafka/probe.py");
            let answer = String::from_utf8_lossy(&probe.stdout);
            if probe.status.success() && (1..=NODES).all(|n| answer.contains(&format!("{n}@"))) {
                return;
            }
            if let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) {
                panic!("node {id} exited with {status}: {}", tail(&log));
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not list the cluster within {START_WITHIN:?}: {}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Kills node `id` with SIGKILL (no shutdown, no flush) and waits until it is gone.
    pub fn kill(&mut self, id: u32) {
        if let Some(mut child) = self.node(id).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `id` again on its log dir and waits until it lists the cluster.
    pub fn restart(&mut self, id: u32) {
        self.spawn(id);
        self.wait_ready(id);
    }

    /// Every node's `127.0.0.1:<port>`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `kafka://<every node>`, for km0's `--broker`.
    pub fn url(&self) -> String {
        format!("kafka://{}", self.bootstrap())
    }

    /// The node leading each partition of `topic`, as the cluster's metadata says.
    pub fn leaders(&self, topic: &str) -> BTreeMap<u32, u32> {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("metadata client");
        let metadata = client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("topic metadata");
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .expect("the topic in the metadata");
        topic
            .partitions()
            .iter()
            .map(|p| (p.id() as u32, p.leader() as u32))
            .collect()
    }

    /// The node that leads the most partitions of `topic`, and those partitions.
    pub fn busiest_leader(&self, topic: &str) -> (u32, Vec<u32>) {
        let leaders = self.leaders(topic);
        (1..=NODES)
            .map(|node| {
                let led: Vec<u32> = leaders
                    .iter()
                    .filter(|(_, l)| **l == node)
                    .map(|(p, _)| *p)
                    .collect();
                (node, led)
            })
            .max_by_key(|(_, led)| led.len())
            .expect("three nodes")
    }

    /// The active controller (the KRaft quorum's leader), asked with Kafka's own Admin client
    /// (`scripts/kafka/Quorum.java`).
    pub fn controller(&self) -> u32 {
        let out = Command::new("java")
            .arg("-cp")
            .arg(format!("{}/*", kafka_libs().display()))
            .arg(repo_root().join("scripts/kafka/Quorum.java"))
            .arg(self.bootstrap())
            .stderr(Stdio::null())
            .output()
            .expect("run scripts/kafka/Quorum.java");
        let answer = String::from_utf8_lossy(&out.stdout);
        answer
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no quorum leader in {answer:?}"))
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        for id in 1..=NODES {
            self.kill(id);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
