//! The payment gateway simulator's ledger, read over its HTTP API as an auditor would.

use serde_json::Value;

/// Every charge the gateway at `gateway` (`http://host:port`) made for `reference`.
pub async fn charges(gateway: &str, reference: &str) -> Vec<Value> {
    let body: Value = reqwest::Client::new()
        .get(format!("{gateway}/cargos"))
        .query(&[("referencia", reference)])
        .send()
        .await
        .expect("the gateway answers")
        .json()
        .await
        .expect("a JSON ledger");
    body["cargos"].as_array().cloned().unwrap_or_default()
}
