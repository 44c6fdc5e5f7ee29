//! A stored-answer handler for the request/reply tests: it counts each order's applications
//! in a table of its own (`pedido_id`, `veces`), so an order applied twice shows as 2.
//! A request with `"falla": true` writes its row, then fails for good (its write must not
//! survive); one with `"lento": true` takes 20 ms after writing.

use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{query, Tx};
use entrega::rpc::AnswerInTx;
use entrega_core::{HandlerError, RpcMessage};
use serde_json::{json, Value};

/// Counts applications in `table`; see the module docs.
pub struct Counting {
    /// The table (`pedido_id TEXT PRIMARY KEY, veces BIGINT NOT NULL`).
    pub table: &'static str,
    /// Waited before each application (calls stay in flight meanwhile).
    pub delay: Duration,
    /// Whether the answer carries the order's count (`veces`).
    pub with_count: bool,
}

impl Counting {
    /// Counts in `table`, at once, answering without the count.
    pub fn new(table: &'static str) -> Self {
        Self {
            table,
            delay: Duration::ZERO,
            with_count: false,
        }
    }

    /// The table's `CREATE` statement.
    pub fn create_table(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (pedido_id TEXT PRIMARY KEY, veces BIGINT NOT NULL)",
            self.table
        )
    }
}

fn body(request: &RpcMessage) -> Result<Value, HandlerError> {
    serde_json::from_slice(&request.payload).map_err(HandlerError::permanent)
}

#[async_trait]
impl AnswerInTx for Counting {
    fn key(&self, request: &RpcMessage) -> Result<String, HandlerError> {
        let body = body(request)?;
        let id = body["pedido_id"]
            .as_str()
            .ok_or_else(|| HandlerError::permanent(std::io::Error::other("sin pedido_id")))?;
        Ok(format!("autorizacion-{id}"))
    }

    async fn answer_in(&self, tx: &mut Tx, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let body = body(request)?;
        let id = body["pedido_id"].as_str().unwrap_or_default().to_owned();
        let t = self.table;
        tx.execute(
            query(format!(
                "INSERT INTO {t} (pedido_id, veces) VALUES ($1, 1) \
                 ON CONFLICT (pedido_id) DO UPDATE SET veces = {t}.veces + 1"
            ))
            .bind(id.clone()),
        )
        .await?;
        if body.get("falla").is_some() {
            return Err(HandlerError::permanent(std::io::Error::other(
                "tarjeta bloqueada",
            )));
        }
        if body.get("lento").is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut answer = json!({"pedido_id": id, "autorizado": true});
        if self.with_count {
            let veces: Option<i64> = tx
                .scalar(
                    query(format!(
                        "SELECT CAST(veces AS BIGINT) FROM {t} WHERE pedido_id = $1"
                    ))
                    .bind(id),
                )
                .await?;
            answer["veces"] = json!(veces.unwrap_or(0));
        }
        Ok(answer.to_string().into_bytes())
    }
}
