//! An Apache Kafka broker of its own for one test: one KRaft node (broker and controller) run
//! from the jars `scripts/lib/kafka.sh` caches, on free ports of 127.0.0.1, with its log dir in
//! a directory of its own, killed and removed when dropped. Each test gets clean topics and
//! groups, and a test may kill, freeze or restart its broker without disturbing others.

#![allow(clippy::panic)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Longest wait for a starting broker to answer a Metadata request.
const START_WITHIN: Duration = Duration::from_secs(90);

pub(super) fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Where Kafka's jars are: `ENTREGA_KAFKA_LIBS` (set by `scripts/test`), else what
/// `ensure_kafka_libs` of `scripts/lib/kafka.sh` answers, downloading them if missing.
pub(super) fn kafka_libs() -> &'static Path {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(|| {
        if let Ok(path) = std::env::var("ENTREGA_KAFKA_LIBS") {
            return PathBuf::from(path);
        }
        let out = Command::new("bash")
            .arg("-c")
            .arg(". scripts/lib/provision.sh && ensure_kafka_libs >&2 && echo \"$KAFKA_LIBS\"")
            .current_dir(repo_root())
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/lib/kafka.sh");
        assert!(out.status.success(), "providing Kafka's jars failed");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A free port other than every one of `taken`: a port just released may be handed out
/// again at once, and a node's listeners must not share one.
pub(super) fn free_port_besides(taken: &[u16]) -> u16 {
    loop {
        let port = free_port();
        if !taken.contains(&port) {
            return port;
        }
    }
}

/// A cluster id as `kafka-storage random-uuid` makes one: 16 random bytes, base64url, no pad,
/// and, as Kafka's own, never starting with `-` (the tool would read it as an option).
pub(super) fn cluster_id() -> String {
    loop {
        let id = encoded_uuid();
        if !id.starts_with('-') {
            return id;
        }
    }
}

fn encoded_uuid() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    let mut bits: u32 = 0;
    let mut held = 0;
    let mut id = String::new();
    for byte in bytes {
        bits = (bits << 8) | u32::from(byte);
        held += 8;
        while held >= 6 {
            held -= 6;
            id.push(char::from(ALPHABET[((bits >> held) & 63) as usize]));
        }
    }
    if held > 0 {
        id.push(char::from(ALPHABET[((bits << (6 - held)) & 63) as usize]));
    }
    id
}

/// The last lines of a log, for a failure message (the log dir goes with the broker).
pub(super) fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// `properties` with `SSL` and `SASL_SSL` listeners on `ports`, advertised as `localhost`,
/// serving `secure`'s certificate from a PEM key store written in `dir`.
fn secure_properties(properties: &str, dir: &Path, secure: &Secure, ports: SecurePorts) -> String {
    let store = dir.join("keystore.pem");
    let key = fs::read_to_string(&secure.key).expect("key");
    let cert = fs::read_to_string(&secure.cert).expect("certificate");
    fs::write(&store, format!("{key}{cert}")).expect("keystore.pem");
    let mut out = String::new();
    for line in properties.lines() {
        let line = if line.starts_with("listeners=") {
            format!(
                "{line},SSL://127.0.0.1:{},SASL_SSL://127.0.0.1:{}",
                ports.ssl, ports.sasl_ssl
            )
        } else if line.starts_with("advertised.listeners=") {
            format!(
                "{line},SSL://localhost:{},SASL_SSL://localhost:{}",
                ports.ssl, ports.sasl_ssl
            )
        } else if line.starts_with("listener.security.protocol.map=") {
            format!("{line},SSL:SSL,SASL_SSL:SASL_SSL")
        } else {
            line.to_owned()
        };
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&format!(
        "ssl.keystore.type=PEM\nssl.keystore.location={}\n\
         sasl.enabled.mechanisms=SCRAM-SHA-256\n\
         listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=\
         org.apache.kafka.common.security.scram.ScramLoginModule required;\n",
        store.display()
    ));
    out
}

/// `java` with Kafka's jars, a heap of at most `heap` and its output appended to `log` in
/// `dir`. A test's broker lives for a minute or two beside the rest of the suite on two cores:
/// it compiles with the client compiler only (`TieredStopAtLevel=1`) and collects with the
/// serial collector, which took a third off the CPU of a test that owns its broker. Brokers
/// that are measured (`scripts/services`) keep Kafka's own settings.
pub(super) fn kafka_java(dir: &Path, log: &str, heap: &str) -> Command {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(log))
        .expect("broker log");
    let err = out.try_clone().expect("broker log");
    let mut java = Command::new("java");
    java.args([
        "-Xms128m",
        &format!("-Xmx{heap}"),
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
    ])
    .arg(format!(
        "-Dlog4j2.configurationFile={}",
        repo_root()
            .join("scripts/kafka/log4j2.properties")
            .display()
    ))
    .arg("-cp")
    .arg(format!("{}/*", kafka_libs().display()))
    .stdin(Stdio::null())
    .stdout(out)
    .stderr(err);
    java
}

/// A running Apache Kafka node owned by one test.
pub struct KafkaBroker {
    child: Option<Child>,
    port: u16,
    advertised: u16,
    dir: PathBuf,
    secure: Option<SecurePorts>,
}

/// What a node with TLS listeners serves, besides its plain one.
#[derive(Debug, Clone)]
pub struct Secure {
    /// The node's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PKCS#8 PEM).
    pub key: PathBuf,
    /// The SCRAM-SHA-256 user made at format time, and its password.
    pub scram: (String, String),
}

/// The ports of a node's TLS listeners, advertised as `localhost` (the name its
/// certificate carries).
#[derive(Debug, Clone, Copy)]
pub struct SecurePorts {
    /// `SSL`: TLS, no authentication.
    pub ssl: u16,
    /// `SASL_SSL`: TLS and SCRAM-SHA-256.
    pub sasl_ssl: u16,
}

impl KafkaBroker {
    /// Starts a broker on a free port and waits until it answers a Metadata request.
    pub fn start() -> Self {
        Self::launch(None, None)
    }

    /// Starts a broker that also serves `SSL` and `SASL_SSL` (SCRAM-SHA-256) listeners with
    /// `secure`'s certificate and user.
    pub fn start_secure(secure: &Secure) -> Self {
        Self::launch(None, Some(secure))
    }

    /// The ports of the TLS listeners of a node started with [`Self::start_secure`].
    pub fn secure_ports(&self) -> SecurePorts {
        self.secure.expect("a broker started with start_secure")
    }

    /// Starts a broker on a free port that tells clients to connect to
    /// `127.0.0.1:<advertised>` instead (a [`super::proxy::Proxy`] in front of it, say).
    pub fn start_advertising(advertised: u16) -> Self {
        Self::launch(Some(advertised), None)
    }

    /// A node on free ports. Tests start brokers in parallel, and a port found free may be
    /// taken by another before this node binds it: a node that exits at start-up is tried
    /// again on other ports.
    fn launch(advertised: Option<u16>, secure: Option<&Secure>) -> Self {
        const ATTEMPTS: usize = 3;
        let mut failures = Vec::new();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            let mut broker = Self::format(port, advertised.unwrap_or(port), secure);
            match broker.spawn_and_wait() {
                Ok(()) => return broker,
                Err(why) => failures.push(why),
            }
        }
        panic!(
            "Kafka did not start in {ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        )
    }

    /// A formatted log dir and the settings of a node on `port`, not started yet.
    fn format(port: u16, advertised: u16, secure: Option<&Secure>) -> Self {
        let dir = std::env::temp_dir().join(format!("km0-kafka-{}-{port}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("data")).expect("broker dir");
        let template = fs::read_to_string(repo_root().join("scripts/kafka/server.properties.in"))
            .expect("scripts/kafka/server.properties.in");
        let controller = free_port_besides(&[port, advertised]);
        let properties = template
            .replace("@PORT@", &port.to_string())
            .replace("@CONTROLLER_PORT@", &controller.to_string())
            .replace("@ADVERTISED_PORT@", &advertised.to_string())
            .replace("@DATA_DIR@", &dir.join("data").to_string_lossy());
        let ports = secure.map(|_| {
            let ssl = free_port_besides(&[port, advertised, controller]);
            let sasl_ssl = free_port_besides(&[port, advertised, controller, ssl]);
            SecurePorts { ssl, sasl_ssl }
        });
        let properties = match (secure, ports) {
            (Some(secure), Some(ports)) => secure_properties(&properties, &dir, secure, ports),
            _ => properties,
        };
        fs::write(dir.join("server.properties"), properties).expect("server.properties");
        let mut format = Self::java(&dir, "format.log");
        format
            .args(["kafka.tools.StorageTool", "format", "--standalone", "-t"])
            .arg(cluster_id())
            .arg("-c")
            .arg(dir.join("server.properties"));
        if let Some(secure) = secure {
            let (user, password) = &secure.scram;
            format
                .arg("--add-scram")
                .arg(format!("SCRAM-SHA-256=[name={user},password={password}]"));
        }
        let format = format.status().expect("run kafka.tools.StorageTool");
        assert!(
            format.success(),
            "formatting Kafka storage failed: {}",
            tail(&dir.join("format.log"))
        );
        Self {
            child: None,
            port,
            advertised,
            dir,
            secure: ports,
        }
    }

    /// `java` with Kafka's jars, a small heap and its output appended to `log` in `dir`.
    fn java(dir: &Path, log: &str) -> Command {
        kafka_java(dir, log, "512m")
    }

    /// Starts the node on its ports and log dir (after [`Self::kill`]) and waits until it
    /// answers a Metadata request listing itself.
    pub fn restart(&mut self) {
        if let Err(why) = self.spawn_and_wait() {
            panic!("{why}");
        }
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "the broker is still running");
        let child = Self::java(&self.dir, "broker.log")
            .arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .spawn()
            .expect("start kafka.Kafka");
        self.child = Some(child);
        self.wait_ready()
    }

    /// Asks with `scripts/kafka/probe.py` (the provisioning's own check), on the node's own
    /// port: a client library would follow the advertised address, which may be a proxy that
    /// is not accepting yet.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_WITHIN;
        let log = self.dir.join("broker.log");
        loop {
            let probe = Command::new("python3")
                .arg(repo_root().join("scripts/kafka/probe.py"))
                .arg(format!("127.0.0.1:{}", self.port))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run scripts/kafka/probe.py");
            if probe.success() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "Kafka on {} exited with {status}: {}",
                        self.port,
                        tail(&log)
                    ));
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "Kafka on {} did not answer a Metadata request within {START_WITHIN:?}: {}",
                    self.port,
                    tail(&log)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills the broker with SIGKILL (no shutdown, no flush) and waits until it is gone; its
    /// log dir stays for [`Self::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its own address (not the advertised one).
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<advertised port>`, for librdkafka's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    /// `kafka://127.0.0.1:<advertised port>`, for km0's `--broker`.
    pub fn url(&self) -> String {
        format!("kafka://{}", self.bootstrap())
    }

    /// The broker's process id (to freeze it with SIGSTOP, for instance).
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("a running broker")
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
