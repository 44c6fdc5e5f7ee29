//! The interop scripts of `interop/`, run with the interop venv's Python.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use km0::services::pedidos::TOPIC;

use crate::common::kafka_ns::KafkaNamespace;

/// Longest run of one Python script.
pub const SCRIPT_WITHIN: Duration = Duration::from_secs(120);

pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The interop interpreter: `KM0_INTEROP_PYTHON`, else provisioned once per test binary.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let path = match std::env::var_os("KM0_INTEROP_PYTHON") {
                Some(path) => PathBuf::from(path),
                None => {
                    let out = std::process::Command::new("bash")
                        .arg("-c")
                        .arg(". scripts/lib/python.sh && ensure_interop_venv && echo \"$KM0_INTEROP_PYTHON\"")
                        .current_dir(repo_root())
                        .stderr(Stdio::inherit())
                        .output()
                        .expect("run bash to provision the interop venv");
                    assert!(out.status.success(), "provisioning Python failed: {}", out.status);
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
                }
            };
            assert!(path.is_file(), "no interop Python at `{}`", path.display());
            path
        })
        .clone()
}

/// What a Python script did: its exit status, its last stdout line as JSON, its stderr.
pub struct Ran {
    pub status: ExitStatus,
    pub summary: Value,
    pub stderr: String,
}

/// A command line split at whitespace (none of the tests' arguments holds any).
pub fn argv(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// Runs `interop/<script>` with `args`, bounded by [`SCRIPT_WITHIN`].
pub async fn run_script(script: &str, args: &[String]) -> Ran {
    let run = Command::new(python())
        .arg(repo_root().join("interop").join(script))
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(SCRIPT_WITHIN, run)
        .await
        .unwrap_or_else(|_| panic!("{script} ran longer than {SCRIPT_WITHIN:?}"))
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    Ran {
        status: out.status,
        summary,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs a script that must succeed; its JSON summary.
pub async fn run_ok(script: &str, args: &[String]) -> Value {
    let ran = run_script(script, args).await;
    assert!(
        ran.status.success(),
        "{script} failed ({}): {}\n{}",
        ran.status,
        ran.summary,
        ran.stderr
    );
    ran.summary
}

/// The topic read to its end, with the committed offsets of `group` (`topic_stats.py`);
/// both named as km0 names them, under the test's namespace on the broker.
pub async fn topic_stats(broker: &KafkaNamespace, topic: &str, group: &str) -> Value {
    let bootstrap = broker.bootstrap();
    let args = argv(&format!(
        "--bootstrap {bootstrap} --topic {} --group {}",
        broker.wire(topic),
        broker.wire(group)
    ));
    run_ok("topic_stats.py", &args).await
}

/// Whether `group` committed every message of the topic.
pub fn caught_up(stats: &Value) -> bool {
    let partitions = stats["partitions"].as_object().expect("partitions");
    partitions
        .values()
        .all(|p| p["end"] == 0 || p["committed"] == p["end"])
}

/// Messages in the dead-letter topic (none when the topic does not exist).
pub async fn dead_letters(broker: &KafkaNamespace) -> i64 {
    let bootstrap = broker.bootstrap();
    let dlq = broker.wire(&format!("{TOPIC}.dlq"));
    let args = argv(&format!("--bootstrap {bootstrap} --topic {dlq}"));
    let ran = run_script("topic_stats.py", &args).await;
    if ran.stderr.contains("UNKNOWN_TOPIC_OR_PART") {
        return 0;
    }
    assert!(ran.status.success(), "reading {dlq}: {}", ran.stderr);
    ran.summary["messages"].as_i64().expect("messages")
}
