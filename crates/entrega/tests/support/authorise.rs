//! A stored-answer handler for the request/reply tests: it counts each order's applications
//! in a table of its own (`pedido_id`, `veces`), so an order applied twice shows as 2.
//! A request with `"falla": true` writes its row, then fails for good (its write must not
//! survive); one with `"lento": true` takes 20 ms after writing. With `as_statements`, a
//! batch of requests none of which fails is written as statements
//! ([`AnswerInTx::writes_for`]: one round trip with its stored answers).

use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{query, Query, Tx};
use entrega::rpc::{AnswerInTx, Writes};
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
    /// Whether a batch is written as statements (not with a count, which needs a read).
    pub as_statements: bool,
}

impl Counting {
    /// Counts in `table`, at once, answering without the count.
    pub fn new(table: &'static str) -> Self {
        Self {
            table,
            delay: Duration::ZERO,
            with_count: false,
            as_statements: false,
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

impl Counting {
    /// One more application of order `id`.
    fn count(&self, id: &str) -> Query {
        let t = self.table;
        query(format!(
            "INSERT INTO {t} (pedido_id, veces) VALUES ($1, 1) \
             ON CONFLICT (pedido_id) DO UPDATE SET veces = {t}.veces + 1"
        ))
        .bind(id)
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

    fn writes_for(&self, requests: &[&RpcMessage]) -> Option<Result<Writes, HandlerError>> {
        if !self.as_statements || self.with_count || !self.delay.is_zero() {
            return None;
        }
        let mut writes = Writes {
            statements: Vec::new(),
            answers: Vec::new(),
        };
        for request in requests {
            let body = match body(request) {
                Ok(body) => body,
                Err(e) => return Some(Err(e)),
            };
            if body.get("falla").is_some() {
                return Some(Err(HandlerError::permanent(std::io::Error::other(
                    "tarjeta bloqueada",
                ))));
            }
            let id = body["pedido_id"].as_str().unwrap_or_default().to_owned();
            writes.statements.push(self.count(&id));
            writes.answers.push(
                json!({"pedido_id": id, "autorizado": true})
                    .to_string()
                    .into_bytes(),
            );
        }
        Some(Ok(writes))
    }

    async fn answer_in(&self, tx: &mut Tx, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let body = body(request)?;
        let id = body["pedido_id"].as_str().unwrap_or_default().to_owned();
        let t = self.table;
        tx.execute(self.count(&id)).await?;
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
