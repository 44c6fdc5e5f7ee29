//! Outbox → relay → idempotent consumer on PostgreSQL, with the log transport in the same
//! database. The server is `ENTREGA_EXAMPLE_PG` (default `postgres://postgres@127.0.0.1:5432`);
//! the database `entrega_example` is created if missing and dropped at the end.
//! `cargo run -p entrega --example postgres`

mod common;

#[tokio::main]
async fn main() -> Result<(), common::BoxError> {
    let server = std::env::var("ENTREGA_EXAMPLE_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    let name = format!("entrega_example_{}", std::process::id());
    let url = entrega_postgres::ensure_database(&server, &name).await?;
    let result = common::round_trip(&url, &url).await;
    let admin = entrega::Db::connect(&format!("{server}/postgres")).await?;
    admin
        .execute(entrega::db::query(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .await?;
    admin.close().await;
    result
}
