//! The README's "Try it by hand", run as written: `km0 up` in an empty folder with no flag
//! and no `KM0_*` variable (the embedded default sets itself up: it makes and migrates its
//! SQLite files), then every command of the section's second block in order (its addresses
//! swapped for the ones `km0 up` picked, `cargo run --release -p km0 --` for the km0 under
//! test). Each must
//! succeed; then every order's final state is read back: paid, cancelled for a city without
//! couriers, for missing stock, for a declined card, and by its customer, each with its reason
//! where the saga gave one; an order for a product an operator added is paid; and the retried
//! request created nothing twice.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The commands of the README's "Try it by hand" section: the lines of its second `sh`
/// block that are not comments.
fn by_hand_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("read README.md");
    let section = readme
        .split("## Try it by hand")
        .nth(1)
        .expect("a \"Try it by hand\" section")
        .split("\n## ")
        .next()
        .unwrap();
    let block = section
        .split("```sh\n")
        .nth(2)
        .expect("the section's second sh block")
        .split("```")
        .next()
        .unwrap();
    block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// A running `km0 up`, killed if the test fails before stopping it.
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `km0 up` in `dir` as the README starts it, every address picked free; its ready line.
fn start_up(dir: &Path) -> (Up, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_km0"))
        .current_dir(dir)
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .env_remove("KM0_DB_PREFIX")
        .env_remove("KM0_MIGRATE")
        .env_remove("KM0_NO_SAGA")
        .args(["up", "--http", "127.0.0.1:0", "--pasarela", "127.0.0.1:0"])
        .args(["--ops", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn km0 up");
    let mut up = Up(child);
    let ready = crate::common::ready_line(&mut up.0, Duration::from_secs(60))
        .expect("km0 up printed no ready line within 60 s");
    (up, ready)
}

fn field(ready: &str, name: &str) -> String {
    ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {ready}"))
        .trim_start_matches("http://")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_by_hand_commands_work_as_written() {
    let dir = std::env::temp_dir().join(format!("km0-hand-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut up, ready) = start_up(&dir);
    let (pedidos, pasarela, ops) = (
        field(&ready, "pedidos"),
        field(&ready, "pasarela_url"),
        field(&ready, "ops"),
    );
    let km0 = env!("CARGO_BIN_EXE_km0");
    let commands = by_hand_commands();
    assert!(commands.len() >= 10, "{commands:?}");
    let mut outputs = Vec::new();
    for command in &commands {
        let command = command
            .replace("localhost:8080", &pedidos)
            .replace("localhost:8095", &pasarela)
            .replace("localhost:9464", &ops)
            .replace("cargo run --release -p km0 --", km0);
        let out = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(&dir)
            .env_remove("KM0_DATABASE")
            .env_remove("KM0_BROKER")
            .env_remove("KM0_MIGRATE")
            .env_remove("KM0_NO_SAGA")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{command}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push((command, stdout));
    }
    // The retried request got the first answer.
    let posts: Vec<&String> = outputs
        .iter()
        .filter(|(c, _)| c.contains("\"id\": \"P-1\""))
        .map(|(_, o)| o)
        .collect();
    assert_eq!(posts.len(), 2);
    let first: Value = serde_json::from_str(posts[0]).unwrap();
    assert_eq!(first["id"], "P-1");
    assert_eq!(
        posts[0], posts[1],
        "the retry was answered as the first request"
    );
    // The covered cities, as reparto's couriers have them.
    let (_, cities) = outputs
        .iter()
        .find(|(c, _)| c.ends_with("/ciudades"))
        .expect("the covered cities command");
    let cities: Value = serde_json::from_str(cities).unwrap();
    assert_eq!(
        cities["ciudades"],
        serde_json::json!(["Barcelona", "Madrid", "Tarragona", "Valencia"])
    );
    let metrics = &outputs.last().unwrap().1;
    assert!(metrics.contains("km0_outbox_pending"), "{metrics}");
    // The stock list shows the product the operator added, what was left of it once P-6 took
    // its 2 (or all 20, listed before P-6's reservation).
    let (_, stock) = outputs
        .iter()
        .find(|(c, _)| c.ends_with("stock list"))
        .expect("the stock list command");
    let honey = stock
        .lines()
        .find(|l| l.starts_with("miel-de-romero "))
        .unwrap_or_else(|| panic!("miel-de-romero in the stock list: {stock}"));
    assert!(honey.ends_with(" 18") || honey.ends_with(" 20"), "{honey}");

    // Every order ends where the README says.
    let http = reqwest::Client::new();
    let expected = [
        ("P-1", "pagado", None),
        ("P-2", "cancelado", Some("ciudad_no_cubierta")),
        ("P-3", "cancelado", Some("queso-curado")),
        ("P-4", "cancelado", Some("tarjeta_rechazada")),
        ("P-5", "cancelado", Some("cancelado por el cliente")),
        ("P-6", "pagado", None),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    for (id, state, reason) in expected {
        loop {
            let order: Value = http
                .get(format!("http://{pedidos}/pedidos/{id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if order["estado"] == state {
                if let Some(reason) = reason {
                    let motivo = order["motivo"].as_str().unwrap_or_default();
                    assert!(motivo.contains(reason), "{id}: {order}");
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} did not end {state}: {order}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Command::new("kill")
        .args(["-TERM", &up.0.id().to_string()])
        .status()
        .unwrap();
    assert!(up.0.wait().unwrap().success());

    // One event for P-1 however often it was asked for, in the file km0 made.
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.join("km0-data").join("pedidos.db").display()
    ))
    .await
    .unwrap();
    let (events,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM outbox WHERE tipo = 'pedido.creado' AND agregado_id = 'P-1'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(events, 1);
    db.close().await;
    let _ = std::fs::remove_dir_all(dir);
}
