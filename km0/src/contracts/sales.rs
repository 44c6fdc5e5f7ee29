//! `analitica.ventas`: sales per market, written by analitica's Kafka transaction.

use entrega::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `ventas.mercado`: what a batch of orders sold in one market (keyed by market).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MarketSales {
    /// The market (`mercado`).
    #[serde(rename = "mercado")]
    pub market: String,
    /// The orders counted, in the order they were read (`pedidos`).
    #[serde(rename = "pedidos")]
    pub orders: Vec<String>,
    /// Units sold (`unidades`).
    #[serde(rename = "unidades")]
    pub units: i64,
    /// What they came to, in cents (`importe_centimos`).
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
}

impl Event for MarketSales {
    const TIPO: &'static str = "ventas.mercado";
    const VERSION: u32 = 1;
}
