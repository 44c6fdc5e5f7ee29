//! Outbox → relay → idempotent consumer on SQLite, with the log transport in a second SQLite
//! file: nothing to install. `cargo run -p entrega --example sqlite`

mod common;

#[tokio::main]
async fn main() -> Result<(), common::BoxError> {
    let dir = std::env::temp_dir().join(format!("entrega-example-{}", std::process::id()));
    let db = format!("sqlite://{}", dir.join("pedidos.db").display());
    let broker = format!("sqlite://{}", dir.join("broker.db").display());
    let result = common::round_trip(&db, &broker).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
