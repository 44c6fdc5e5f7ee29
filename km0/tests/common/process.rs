//! Real `km0` processes for crash tests: a deployment on fresh databases, its components
//! started as child processes (optionally with failpoints), stopped with SIGTERM or killed
//! with SIGKILL, each with bounded waits.

#![allow(clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use km0::wiring::config::DataPlace;
use km0::wiring::System;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::state::DbState;

/// Longest wait for a process's ready line.
pub const READY_WITHIN: Duration = Duration::from_secs(30);
/// Longest wait for a process to exit after a signal or a failpoint.
pub const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// One km0 deployment on fresh databases, shared by the processes a test starts and by the
/// test itself (which reads the state through [`DbState`]).
pub struct Deployment {
    /// The deployment, for opening its databases in the test.
    pub system: System,
    backend: String,
    args: Vec<String>,
    logs: PathBuf,
    destroyed: bool,
}

impl Deployment {
    /// Fresh databases of `backend` (`sqlite` or `postgres`); processes use a lease period
    /// of `lease_ttl_ms`, so a killed instance's lanes and partitions are taken over quickly.
    pub fn new(backend: &str, lease_ttl_ms: u64) -> Self {
        Self::build(super::test_system(backend), backend, lease_ttl_ms)
    }

    /// Fresh databases of `backend` with the broker at `broker_url` instead of the log
    /// transport (e.g. `kafka://127.0.0.1:<port>` of a test's own broker).
    pub fn with_broker(backend: &str, broker_url: &str, lease_ttl_ms: u64) -> Self {
        let databases = super::test_system(backend).databases().clone();
        let system = System::new(databases, broker_url.to_owned())
            .with_lease_ttl(Duration::from_millis(lease_ttl_ms));
        Self::build(system, backend, lease_ttl_ms)
    }

    /// Fresh databases on the PostgreSQL server at `server` (a test's own), the log
    /// transport in one of them.
    pub fn on_postgres(server: &str, lease_ttl_ms: u64) -> Self {
        use km0::wiring::config::Databases;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let databases = Databases {
            place: DataPlace::PostgresServer(server.to_owned()),
            prefix: Some(format!("entrega_t_{id}_")),
        };
        let system = System::new(databases, format!("{server}/entrega_t_{id}_broker"))
            .with_lease_ttl(Duration::from_millis(lease_ttl_ms));
        Self::build(system, "postgres", lease_ttl_ms)
    }

    fn build(system: System, backend: &str, lease_ttl_ms: u64) -> Self {
        let database = match &system.databases().place {
            DataPlace::SqliteDir(dir) => format!("sqlite://{}", dir.display()),
            DataPlace::PostgresServer(server) => server.clone(),
        };
        let mut args = vec![
            "--database".to_owned(),
            database,
            "--broker".to_owned(),
            system.broker_url().to_owned(),
            "--lease-ttl-ms".to_owned(),
            lease_ttl_ms.to_string(),
        ];
        if let Some(prefix) = &system.databases().prefix {
            args.extend(["--db-prefix".to_owned(), prefix.clone()]);
        }
        let logs =
            std::env::temp_dir().join(format!("km0-crash-logs-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&logs).expect("log directory");
        // Shown only when the test fails: where each process wrote its stderr.
        eprintln!("{backend}: km0 process logs in {}", logs.display());
        Self {
            system,
            backend: backend.to_owned(),
            args,
            logs,
            destroyed: false,
        }
    }

    /// The deployment's databases and broker, as the processes see them.
    pub fn system(&self) -> &System {
        &self.system
    }

    /// The backend's name.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Opens the deployment's databases (migrating them) for the test to read and write.
    pub async fn state(&self) -> DbState {
        DbState::open(&self.system).await
    }

    /// The deployment's rows, with the stock filled for a stream of orders; the stock it
    /// starts from.
    pub async fn stocked_state(&self) -> (DbState, std::collections::BTreeMap<String, i64>) {
        let state = self.state().await;
        let start = super::kafka_state::orders::fill_stock(&state).await;
        (state, start)
    }

    /// Starts `km0 run <component> --instance <instance>` with `failpoints` (empty: none)
    /// in `ENTREGA_FAILPOINTS`, without waiting for it to be ready.
    pub fn spawn(&self, component: &str, instance: &str, failpoints: &str) -> Km0 {
        self.spawn_with(component, instance, failpoints, &[])
    }

    /// [`Deployment::spawn`] with more arguments after `run <component>` (e.g.
    /// `--pasarela-url URL`).
    pub fn spawn_with(
        &self,
        component: &str,
        instance: &str,
        failpoints: &str,
        extra: &[String],
    ) -> Km0 {
        let mut args = run_args(component, instance);
        args.extend_from_slice(extra);
        self.spawn_args(instance, failpoints, &args)
    }

    /// Starts `km0 <deployment's arguments> <args>` (e.g. `--saga up --http ...`), its log
    /// named after `instance`, without waiting for it to be ready.
    pub fn spawn_args(&self, instance: &str, failpoints: &str, args: &[String]) -> Km0 {
        self.spawn_args_env(instance, failpoints, args, &[])
    }

    /// Starts `km0 run <component>` with `env` set, and waits for its ready line (e.g.
    /// `PGAPPNAME`, to find its database sessions).
    pub async fn start_with_env(
        &self,
        component: &str,
        instance: &str,
        env: &[(&str, &str)],
    ) -> Km0 {
        let args = run_args(component, instance);
        let mut process = self.spawn_args_env(instance, "", &args, env);
        process.wait_ready().await;
        process
    }

    /// [`Deployment::spawn_args`] with `env` set in the process.
    pub fn spawn_args_env(
        &self,
        instance: &str,
        failpoints: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Km0 {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{instance}.log")))
            .expect("process log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_km0"));
        command
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            // The seed's first flow unless a test asks for the saga (`--saga` wins).
            .env("KM0_NO_SAGA", "true")
            // Deliveries stay assigned unless a test makes them.
            .env("KM0_DELIVERY_TIME_S", "0")
            .args(&self.args)
            .args(args)
            .env_remove("KM0_DATABASE")
            .env_remove("KM0_BROKER")
            .env_remove("KM0_DB_PREFIX")
            .env_remove("KM0_LEASE_TTL_MS")
            .env_remove("KM0_KEY_CONCURRENCY")
            .env_remove("KM0_INSTANCE")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            // A failing test must not leave processes behind.
            .kill_on_drop(true);
        if failpoints.is_empty() {
            command.env_remove(entrega::failpoint::ENV);
        } else {
            command.env(entrega::failpoint::ENV, failpoints);
        }
        let mut child = command.spawn().expect("spawn km0");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stdout).lines();
            // Keep reading to the end so the child never blocks on a full pipe.
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("km0 ready") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(line);
                    }
                }
            }
        });
        Km0 {
            name: instance.to_owned(),
            log: self.logs.join(format!("{instance}.log")),
            child,
            ready_rx: Some(rx),
            ready: None,
        }
    }

    /// Runs `km0 <args>` against the deployment to completion (a CLI command such as
    /// `outbox status --json`) and returns its output.
    pub async fn cli(&self, args: &[&str]) -> std::process::Output {
        let run = Command::new(env!("CARGO_BIN_EXE_km0"))
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            // The seed's first flow unless a test asks for the saga (`--saga` wins).
            .env("KM0_NO_SAGA", "true")
            // Deliveries stay assigned unless a test makes them.
            .env("KM0_DELIVERY_TIME_S", "0")
            .args(&self.args)
            .args(args)
            .env_remove("KM0_DATABASE")
            .env_remove("KM0_BROKER")
            .env_remove("KM0_DB_PREFIX")
            .env_remove("KM0_LEASE_TTL_MS")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        tokio::time::timeout(EXIT_WITHIN, run)
            .await
            .unwrap_or_else(|_| panic!("km0 {args:?} did not finish within {EXIT_WITHIN:?}"))
            .unwrap_or_else(|e| panic!("km0 {args:?}: {e}"))
    }

    /// Starts `km0 <global> up` with every address picked free (pedidos, the gateway, the
    /// operations endpoint), waits for its ready line and returns it with the endpoint's
    /// address.
    pub async fn start_up(&self, instance: &str, global: &[&str]) -> (Km0, String) {
        let mut args: Vec<String> = global.iter().map(|a| (*a).to_owned()).collect();
        args.extend(
            [
                "up",
                "--http",
                "127.0.0.1:0",
                "--pasarela",
                "127.0.0.1:0",
                "--ops",
                "127.0.0.1:0",
            ]
            .map(str::to_owned),
        );
        let mut up = self.spawn_args(instance, "", &args);
        let ready = up.wait_ready().await;
        let ops = ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ops="))
            .expect("ops= in the ready line")
            .to_owned();
        (up, ops)
    }

    /// Starts a component without failpoints and waits for its ready line.
    pub async fn start(&self, component: &str, instance: &str) -> Km0 {
        let mut process = self.spawn(component, instance, "");
        process.wait_ready().await;
        process
    }

    /// Starts `component` once per name in `instances`, one after the other, each waited for.
    pub async fn start_each(&self, component: &str, instances: &[&str]) -> Vec<Km0> {
        let mut started = Vec::with_capacity(instances.len());
        for instance in instances {
            started.push(self.start(component, instance).await);
        }
        started
    }

    /// Removes the deployment's databases and the process logs (kept when
    /// `KM0_TEST_KEEP_LOGS` is set, to read how a passing run went).
    pub async fn destroy(mut self) {
        self.destroyed = true;
        remove(&self.system).await;
        if std::env::var_os("KM0_TEST_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

/// Removes every database of `system` (the SQLite directory with whatever is in it).
async fn remove(system: &System) {
    match &system.databases().place {
        DataPlace::SqliteDir(dir) => {
            let _ = std::fs::remove_dir_all(dir);
        }
        DataPlace::PostgresServer(_) => {
            let _ = system.destroy().await;
        }
    }
}

impl Drop for Deployment {
    /// A test that failed still drops its databases; its logs are kept for reading.
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        let system = self.system.clone();
        // On its own thread: this may run inside the test's runtime, which cannot block.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(remove(&system));
            }
        })
        .join();
    }
}

/// `run <component> --instance <instance> --http 127.0.0.1:0`.
pub fn run_args(component: &str, instance: &str) -> Vec<String> {
    [
        "run",
        component,
        "--instance",
        instance,
        "--http",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A running `km0` child process.
pub struct Km0 {
    /// Its instance name.
    pub name: String,
    log: PathBuf,
    child: Child,
    ready_rx: Option<oneshot::Receiver<String>>,
    ready: Option<String>,
}

impl Km0 {
    /// The file its stderr (its log) goes to.
    pub fn log_path(&self) -> PathBuf {
        self.log.clone()
    }

    /// Waits (bounded) for the ready line; fails the test if the process exits first.
    pub async fn wait_ready(&mut self) -> String {
        if let Some(line) = &self.ready {
            return line.clone();
        }
        let rx = self.ready_rx.take().expect("ready line awaited once");
        let waited = tokio::select! {
            line = tokio::time::timeout(READY_WITHIN, rx) => Some(line),
            _ = self.child.wait() => None,
        };
        let line = match waited {
            Some(Ok(Ok(line))) => line,
            Some(Err(_)) => panic!(
                "{} printed no ready line within {READY_WITHIN:?}; see {}",
                self.name,
                self.log.display()
            ),
            // The process ended (or closed its stdout) without a ready line.
            Some(Ok(Err(_))) | None => {
                let status = self.child.wait().await;
                panic!(
                    "{} exited ({status:?}) before it was ready; see {}",
                    self.name,
                    self.log.display()
                )
            }
        };
        self.ready = Some(line.clone());
        line
    }

    /// The HTTP address announced in the ready line (pedidos', or pasarela's).
    pub fn http_addr(&self) -> SocketAddr {
        let line = self.ready.as_deref().expect("process is ready");
        line.split_whitespace()
            .find_map(|w| {
                w.strip_prefix("pedidos=")
                    .or_else(|| w.strip_prefix("pasarela="))
            })
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP address in `{line}`"))
    }

    /// Its process id while it runs (to signal it, e.g. SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running process")
    }

    /// The exit status if the process has ended, `None` while it runs.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits (bounded) for the process to end by itself, e.g. at a failpoint set to `exit`.
    pub async fn exited(&mut self) -> ExitStatus {
        match tokio::time::timeout(EXIT_WITHIN, self.child.wait()).await {
            Ok(status) => status.expect("wait"),
            Err(_) => panic!(
                "{} did not exit within {EXIT_WITHIN:?}; see {}",
                self.name,
                self.log.display()
            ),
        }
    }

    /// Asserts the process is still running (it did not stop by itself during the test).
    pub fn assert_running(&mut self) {
        assert!(
            self.exit_status().is_none(),
            "{} stopped during the test; see {}",
            self.name,
            self.log.display()
        );
    }

    /// Asserts the process died at a failpoint set to `exit` (status 137, no cleanup).
    pub async fn died_at_failpoint(&mut self) {
        let status = self.exited().await;
        assert_eq!(
            status.code(),
            Some(137),
            "{} should have died at its failpoint ({status}); see {}",
            self.name,
            self.log.display()
        );
    }

    /// SIGKILL: the process dies at once, whatever it is doing (no cleanup, locks and
    /// connections dropped by the OS).
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        let status = self.exited().await;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{} was not killed by SIGKILL: {status}",
            self.name
        );
    }

    /// SIGTERM, then waits (bounded) and asserts a clean exit.
    pub async fn terminate(mut self) {
        let pid = self.child.id().expect("running process").to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("kill -TERM");
        assert!(sent.success(), "could not signal {}", self.name);
        let status = self.exited().await;
        assert!(
            status.success(),
            "{} did not stop cleanly: {status}; see {}",
            self.name,
            self.log.display()
        );
    }
}
