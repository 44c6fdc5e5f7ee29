//! `km0 run` processes a bench starts on its own deployment: this very binary, with the
//! deployment's `--database`, `--db-prefix` and `--broker`, each process's log in a file of
//! the run's directory, each one's CPU counted under its instance name.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use super::cpu::Labels;
use crate::wiring::config::DataPlace;
use crate::wiring::System;

/// How long a process may take to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The processes of one measurement.
pub(crate) struct Fleet {
    exe: PathBuf,
    args: Vec<String>,
    logs: PathBuf,
    labels: Labels,
    children: Vec<Child>,
    /// Whether pedidos runs every order through the order saga.
    saga: bool,
}

impl Fleet {
    /// Processes on `system`'s databases and broker, their CPU counted in `labels`.
    pub(crate) fn new(system: &System, labels: Labels) -> anyhow::Result<Self> {
        let databases = system.databases();
        let database = match &databases.place {
            DataPlace::PostgresServer(server) => server.clone(),
            DataPlace::SqliteDir(dir) => format!("sqlite://{}", dir.display()),
        };
        let mut args = vec![
            "--database".to_owned(),
            database,
            "--broker".to_owned(),
            system.broker_url().to_owned(),
            "--max-batch".to_owned(),
            system.max_batch().to_string(),
        ];
        if let Some(prefix) = &databases.prefix {
            args.extend(["--db-prefix".to_owned(), prefix.clone()]);
        }
        let logs =
            std::env::temp_dir().join(format!("km0-bench-scale-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&logs).context("the processes' log directory")?;
        Ok(Self {
            exe: std::env::current_exe().context("the km0 binary")?,
            args,
            logs,
            labels,
            children: Vec::new(),
            saga: false,
        })
    }

    /// The same processes with every order run through the order saga (they need the same
    /// choice), and `args` added to each process's global options.
    pub(crate) fn with_saga(mut self, args: &[String]) -> Self {
        self.saga = true;
        self.args.extend_from_slice(args);
        self
    }

    /// Starts `km0 run <component> --instance <instance>` and waits for its ready line; the
    /// address of its HTTP API, when it serves one.
    async fn start(
        &mut self,
        component: &str,
        instance: &str,
    ) -> anyhow::Result<Option<SocketAddr>> {
        self.start_with(component, instance, &[]).await
    }

    /// [`Fleet::start`] with `extra` options after `run <component>`.
    pub(crate) async fn start_with(
        &mut self,
        component: &str,
        instance: &str,
        extra: &[String],
    ) -> anyhow::Result<Option<SocketAddr>> {
        let mut args: Vec<String> = ["run", component, "--instance", instance]
            .map(str::to_owned)
            .to_vec();
        args.extend(["--http".to_owned(), "127.0.0.1:0".to_owned()]);
        args.extend_from_slice(extra);
        self.spawn(component, instance, &args).await
    }

    /// Starts `km0 up` (every service in one process, the gateway simulator beside them), its
    /// CPU counted as `instance`; the address of pedidos' HTTP API.
    pub(crate) async fn start_up(&mut self, instance: &str) -> anyhow::Result<Option<SocketAddr>> {
        let args = [
            "up",
            "--http",
            "127.0.0.1:0",
            "--pasarela",
            "127.0.0.1:0",
            "--ops",
            "127.0.0.1:0",
            "--no-console",
        ]
        .map(str::to_owned);
        self.spawn("pedidos", instance, &args).await
    }

    /// Starts this binary with `args` after the deployment's options, waits for its ready line
    /// and returns the address it names for `component`.
    async fn spawn(
        &mut self,
        component: &str,
        instance: &str,
        args: &[String],
    ) -> anyhow::Result<Option<SocketAddr>> {
        let log = std::fs::File::create(self.logs.join(format!("{instance}.log")))
            .context("a process log")?;
        let mut command = Command::new(&self.exe);
        if self.saga {
            command.env_remove("KM0_NO_SAGA");
        } else {
            command.env("KM0_NO_SAGA", "true");
        }
        let mut child = command
            .env("KM0_MIGRATE", "true")
            .args(&self.args)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting km0 run {component}"))?;
        if let Some(pid) = child.id() {
            self.labels.add(pid, instance);
        }
        let stdout = child.stdout.take().context("the process's stdout")?;
        self.children.push(child);
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stdout).lines();
            // Read to the end, so the process never blocks on a full pipe.
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("km0 ready") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(line);
                    }
                }
            }
        });
        let Ok(Ok(line)) = tokio::time::timeout(READY_WITHIN, rx).await else {
            bail!(
                "km0 run {component} ({instance}) was not ready within {READY_WITHIN:?}; its log: {}",
                self.logs.join(format!("{instance}.log")).display()
            );
        };
        Ok(line.split_whitespace().find_map(|w| {
            w.strip_prefix(&format!("{component}="))
                .and_then(|a| a.parse().ok())
        }))
    }

    /// Starts `k` instances of `component`, named `<component>-1` to `<component>-k`, one
    /// after another; their HTTP addresses.
    pub(crate) async fn start_each(
        &mut self,
        component: &str,
        k: usize,
    ) -> anyhow::Result<Vec<Option<SocketAddr>>> {
        let mut addresses = Vec::with_capacity(k);
        for i in 1..=k {
            addresses.push(self.start(component, &format!("{component}-{i}")).await?);
        }
        Ok(addresses)
    }

    /// Where the processes' logs are.
    pub(crate) fn logs(&self) -> &std::path::Path {
        &self.logs
    }

    /// Whether every process still runs.
    pub(crate) fn all_running(&mut self) -> bool {
        self.children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops every process and removes their logs.
    pub(crate) async fn stop(mut self) {
        for child in &mut self.children {
            let _ = child.start_kill();
        }
        for child in &mut self.children {
            let _ = child.wait().await;
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}
