//! The console's consumer groups as one process sees them: `km0 run inventario --ops ..
//! --console` alone on a fresh deployment. Inventario's own groups have a live member (its
//! heartbeat in the log's membership table); every other group of km0 is marked *not
//! running*, since no process runs it; and `km0 lag` says the same of them.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::process::Deployment;
use common::state::eventually;
use km0::services::inventario::{COMMANDS_GROUP, GROUP};

/// Each group row of the overview: (group, whether marked running).
fn group_rows(html: &str) -> Vec<(String, bool)> {
    html.split("<tr>")
        .filter_map(|row| {
            let name = row
                .split("data-testid=\"group-name\">")
                .nth(1)?
                .split('<')
                .next()?
                .to_owned();
            let running = row.contains("data-testid=\"group-members\"");
            let idle = row.contains("data-testid=\"group-idle\"");
            assert!(running != idle, "one mark per row: {row}");
            Some((name, running))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_no_process_runs_are_marked_not_running() {
    let deployment = Deployment::new("sqlite", 1_000);
    let extra = [
        "--ops".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--console".to_owned(),
    ];
    let mut inventario = deployment.spawn_with("inventario", "inventario-1", "", &extra);
    let line = inventario.wait_ready().await;
    let ops: SocketAddr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ops="))
        .expect("ops= in the ready line")
        .parse()
        .unwrap();
    let mine = [GROUP, COMMANDS_GROUP];
    let rows = eventually(
        Duration::from_secs(30),
        "inventario's groups shown with a member",
        || async {
            let html = reqwest::get(format!("http://{ops}/console/"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            let rows = group_rows(&html);
            mine.iter()
                .all(|g| rows.iter().any(|(name, running)| name == g && *running))
                .then_some(rows)
        },
    )
    .await;
    let others: Vec<&(String, bool)> = rows
        .iter()
        .filter(|(name, _)| !mine.contains(&name.as_str()))
        .collect();
    assert!(!others.is_empty(), "{rows:?}");
    assert!(
        others.iter().all(|(_, running)| !running),
        "only inventario runs: {rows:?}"
    );

    let out = deployment.cli(&["lag"]).await;
    assert!(out.status.success(), "km0 lag: {out:?}");
    let lag = String::from_utf8_lossy(&out.stdout).into_owned();
    for (name, _) in &others {
        assert!(
            lag.lines()
                .any(|l| l.starts_with(&format!("group {name} on "))
                    && l.ends_with("(no member running)")),
            "{name} in `km0 lag`:\n{lag}"
        );
    }
    inventario.terminate().await;
    deployment.destroy().await;
}
