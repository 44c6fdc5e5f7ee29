//! The shipped alert rules (`deploy/prometheus/alerts.yml`) are valid, fire as their unit
//! tests say (`promtool test rules`), and only name metrics km0 documents as exported.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

/// `KM0_PROMTOOL` (set by `scripts/test`, which provisions it), else `promtool` on PATH.
fn promtool() -> String {
    std::env::var("KM0_PROMTOOL").unwrap_or_else(|_| "promtool".to_owned())
}

fn run(args: &[&str]) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(rules_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {} (set KM0_PROMTOOL, or run scripts/test): {e}",
                promtool()
            )
        });
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_rules_are_valid() {
    run(&["check", "rules", "alerts.yml"]);
}

#[test]
fn the_rules_fire_as_their_unit_tests_expect() {
    run(&["test", "rules", "alerts_test.yml"]);
}

/// Every `km0_` name in `text`.
fn km0_metrics(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("km0_") && w.len() > 4)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_rules_name_only_documented_metrics() {
    let rules = std::fs::read_to_string(rules_dir().join("alerts.yml")).unwrap();
    let operations = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/OPERATIONS.md"),
    )
    .unwrap();
    let documented = km0_metrics(&operations);
    let used = km0_metrics(&rules);
    assert!(!used.is_empty(), "the rules name km0's metrics");
    let undocumented: Vec<_> = used.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "alerts.yml names metrics docs/OPERATIONS.md does not list: {undocumented:?}"
    );
}
