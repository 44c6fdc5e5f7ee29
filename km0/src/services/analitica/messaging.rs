//! What analitica reads and writes: `pedido.creado` from `pedidos.eventos` in, one
//! `ventas.mercado` per market and batch out to `analitica.ventas`, both in one Kafka
//! transaction with the group's offsets (`entrega_kafka::KafkaTransformer`).

use async_trait::async_trait;
use entrega_core::headers::{ID_EVENTO, ONLY_GROUP, TIPO};
use entrega_core::{Envelope, HandlerError, Headers, OutgoingMessage, Record};
use entrega_kafka::Transform;

use super::domain::{per_market, MarketSales, OrderView, Sale, SaleError};
use crate::contracts;
use crate::services::pedidos::ORDER_CREATED;

/// analitica's consumer group on `pedidos.eventos`.
pub const GROUP: &str = "analitica";
/// Topic of the sales per market (`analitica.ventas`), keyed by market.
pub const OUTPUT_TOPIC: &str = "analitica.ventas";
/// Partitions of [`OUTPUT_TOPIC`] when km0 creates it.
pub const OUTPUT_PARTITIONS: u32 = 3;
/// The event analitica writes: one market's sales in one batch (`ventas.mercado`).
pub const MARKET_SALES: &str = "ventas.mercado";
/// The producing service (`origen`).
pub const SOURCE: &str = "analitica";

/// Turns a batch of order events into sales per market; an event that cannot be counted
/// becomes a dead letter written in the same transaction, so it leaves the input exactly once
/// too.
#[derive(Debug, Clone)]
pub struct SalesTransform {
    input: String,
    dlq: String,
    replay_key: Option<entrega_core::ReplayKey>,
}

impl SalesTransform {
    /// Reads `input` (km0's `pedidos.eventos`); dead letters go to `<input>.dlq`.
    pub fn new(input: &str) -> Self {
        Self {
            input: input.to_owned(),
            dlq: format!("{input}.dlq"),
            replay_key: None,
        }
    }

    /// Obeys `entrega-only-group` only when its signature verifies with `key`; without a key
    /// every record is counted, whatever its headers say.
    pub fn with_replay_key(mut self, key: Option<entrega_core::ReplayKey>) -> Self {
        self.replay_key = key;
        self
    }

    /// Whether `record` is a signed replay meant for another group.
    fn for_another_group(&self, record: &Record) -> bool {
        record.headers.get_current(ONLY_GROUP).is_some()
            && self.replay_key.as_ref().is_some_and(|key| {
                key.solo_group(&record.headers, record.key.as_deref(), &record.payload)
                    .is_some_and(|g| g.is_ok_and(|g| g != GROUP))
            })
    }

    /// The sale of one record: `Ok(None)` for an event that is not a sale, `Err` with the
    /// reason for one that cannot be counted.
    fn sale(record: &Record) -> Result<Option<Sale>, String> {
        let envelope = Envelope::parse(&record.payload).map_err(|e| format!("envoltura: {e}"))?;
        if envelope.kind != ORDER_CREATED {
            return Ok(None);
        }
        if contracts::is_other_copy::<OrderView>(&record.headers, envelope.version) {
            // The same order published at another version, counted from that copy.
            return Ok(None);
        }
        Sale::from_envelope(&envelope)
            .map(Some)
            .map_err(|e| match e {
                SaleError::Contract(_) => e.to_string(),
                other => format!("datos: {other}"),
            })
    }

    fn sales_message(sales: &MarketSales) -> Result<OutgoingMessage, HandlerError> {
        let data = serde_json::to_value(sales).map_err(HandlerError::permanent)?;
        let envelope = Envelope::new(MARKET_SALES, SOURCE, data);
        let mut headers = Headers::new();
        headers.set(TIPO, MARKET_SALES);
        headers.set(ID_EVENTO, envelope.id.hyphenated().to_string());
        Ok(OutgoingMessage {
            topic: OUTPUT_TOPIC.to_owned(),
            key: Some(sales.market.clone()),
            headers,
            payload: envelope.to_bytes(),
        })
    }
}

#[async_trait]
impl Transform for SalesTransform {
    async fn transform(&self, batch: &[Record]) -> Result<Vec<OutgoingMessage>, HandlerError> {
        let mut sales = Vec::new();
        let mut out = Vec::new();
        for record in batch {
            // A dead letter replayed to another group is not ours to count.
            if self.for_another_group(record) {
                continue;
            }
            match Self::sale(record) {
                Ok(Some(sale)) => sales.push(sale),
                Ok(None) => {}
                Err(reason) => out.push(entrega::dlq::dead_letter_of(
                    record,
                    GROUP,
                    &self.dlq,
                    1,
                    &format!("permanente: {reason}"),
                )),
            }
        }
        for market in per_market(&sales).values() {
            out.push(Self::sales_message(market)?);
        }
        tracing::debug!(input = %self.input, records = batch.len(), sales = sales.len(), "batch");
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(offset: i64, envelope: &Envelope) -> Record {
        Record {
            topic: "pedidos.eventos".into(),
            partition: 0,
            offset,
            key: Some("P-1".into()),
            headers: Headers::new(),
            payload: envelope.to_bytes(),
            timestamp_ms: 0,
        }
    }

    fn created(id: &str, market: &str, cents: i64) -> Envelope {
        Envelope::new(
            ORDER_CREATED,
            "pedidos",
            json!({"id": id, "cliente": "ana", "mercado": market,
                   "lineas": [{"producto": "queso-curado", "cantidad": 1, "precio_centimos": cents}]}),
        )
    }

    #[tokio::test]
    async fn sales_per_market_and_dead_letters_in_one_result() {
        let mut newer = created("P-9", "reus", 5);
        newer.version = 3;
        let batch = vec![
            record(0, &created("P-1", "girona", 100)),
            record(
                1,
                &Envelope::new("pedido.pagado", "pedidos", json!({"id": "P-1"})),
            ),
            record(2, &created("P-2", "girona", 50)),
            record(3, &newer),
            Record {
                payload: b"{no json".to_vec(),
                ..record(4, &created("x", "y", 0))
            },
        ];
        let out = SalesTransform::new("pedidos.eventos")
            .transform(&batch)
            .await
            .unwrap();
        let sales: Vec<&OutgoingMessage> = out.iter().filter(|m| m.topic == OUTPUT_TOPIC).collect();
        assert_eq!(sales.len(), 1);
        let envelope = Envelope::parse(&sales[0].payload).unwrap();
        let datos: MarketSales = serde_json::from_value(envelope.data).unwrap();
        assert_eq!(datos.orders, vec!["P-1", "P-2"]);
        assert_eq!(datos.amount_cents, 150);
        assert_eq!(sales[0].key.as_deref(), Some("girona"));
        let dead: Vec<&OutgoingMessage> = out
            .iter()
            .filter(|m| m.topic == "pedidos.eventos.dlq")
            .collect();
        assert_eq!(dead.len(), 2);
        assert!(dead[0].headers.get("motivo").unwrap().contains("esquema"));
        assert!(dead[1].headers.get("motivo").unwrap().contains("envoltura"));
        assert_eq!(dead[1].headers.get("entrega-origin-offset"), Some("4"));
    }
}
