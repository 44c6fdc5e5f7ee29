//! `--log-json`: every line km0 logs is one JSON object with its level, target and fields.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use serde_json::Value;

use crate::common::embedded_km0;

#[test]
fn every_log_line_is_a_json_object() {
    let dir = std::env::temp_dir().join(format!("km0-log-json-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = embedded_km0(&dir)
        .args(["--log-json", "migrate"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run km0");
    assert!(out.status.success(), "km0 migrate failed: {out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    // Migrating fresh databases logs each migration applied.
    let applied: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "applied migration")
        .collect();
    assert!(!applied.is_empty(), "no migration logged: {stderr}");
    for line in &applied {
        assert_eq!(line["level"], "INFO", "{line}");
        assert!(
            line["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("entrega")),
            "{line}"
        );
        assert!(
            line["fields"]["set"].is_string(),
            "the migration set as a field: {line}"
        );
        assert!(line["timestamp"].is_string(), "{line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
