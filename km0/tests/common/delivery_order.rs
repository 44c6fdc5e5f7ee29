//! Per-key order as a consumer sees it: a consumer group of the test's own on pedidos' topic
//! (an entrega `Worker`, its queues made before anything is published) that keeps every
//! delivery of `pedido.creado` and `pedido.pagado` in the order it was handed them. The
//! inventario group applies only `pedido.creado`, so its rows cannot say whether an order's
//! two events arrived in order; this group's deliveries can.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use entrega::WorkerConfig;
use entrega::{Broker, CancellationToken, Handler, HandlerError, Message, Router, Worker};
use km0::services::pedidos::{ORDER_CREATED, ORDER_PAID, TOPIC};
use tokio::task::JoinHandle;

use super::kafka_state::orders::Placed;

/// Keeps `(key, id_evento)` of each delivery, in the order of delivery.
struct Record(Arc<Mutex<Vec<(String, String)>>>);

#[async_trait]
impl Handler for Record {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let key = msg.key.clone().unwrap_or_default();
        let id = msg.envelope.id.hyphenated().to_string();
        self.0.lock().unwrap().push((key, id));
        Ok(())
    }
}

/// A group of the test's own consuming pedidos' topic, keeping its deliveries.
pub struct DeliveryLog {
    deliveries: Arc<Mutex<Vec<(String, String)>>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    broker: Broker,
}

impl DeliveryLog {
    /// Joins a new group on pedidos' topic at `url`; its queues exist when this returns, so
    /// every event published from then on reaches it.
    pub async fn start(url: &str) -> Self {
        let broker = Broker::connect(url, Duration::from_secs(10))
            .await
            .expect("connect the delivery log's consumer");
        let group = format!("km0-order-{}", uuid::Uuid::new_v4().simple());
        let mut probe = broker
            .subscriber()
            .subscribe(&group, TOPIC, "probe")
            .await
            .expect("make the delivery log's queues");
        probe.close().await.expect("close the probe");
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::new(Record(deliveries.clone()));
        let mut config = WorkerConfig::new(&group, TOPIC);
        config.member = "delivery-log".to_owned();
        let worker = Worker::new(
            broker.subscriber(),
            broker.publisher(),
            Router::new()
                .route(ORDER_CREATED, record.clone())
                .route(ORDER_PAID, record),
            config,
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { worker.run(stop).await.expect("the delivery log's worker") }
        });
        Self {
            deliveries,
            stop,
            task,
            broker,
        }
    }

    /// Whether every event of `placed` was delivered at least once.
    pub fn has_all(&self, placed: &[Placed]) -> bool {
        let delivered: std::collections::HashSet<String> = self
            .deliveries
            .lock()
            .unwrap()
            .iter()
            .map(|(_, id)| id.clone())
            .collect();
        placed
            .iter()
            .flat_map(|p| &p.events)
            .all(|(_, id)| delivered.contains(id))
    }

    /// Stops the group; its deliveries, in order.
    pub async fn stop(self) -> Vec<(String, String)> {
        self.stop.cancel();
        self.task.await.expect("the delivery log's task");
        self.broker.close().await;
        Arc::try_unwrap(self.deliveries)
            .expect("the worker is gone")
            .into_inner()
            .unwrap()
    }
}

/// Asserts every event of `placed` was delivered, under its order's key, and each order's
/// events first delivered in the order they were committed (`pedido.pagado` never before its
/// `pedido.creado`). Returns how many deliveries repeated one already made (at least once
/// allows them; they are reported).
pub fn assert_delivered_in_key_order(deliveries: &[(String, String)], placed: &[Placed]) -> usize {
    let mut first: HashMap<&str, (usize, &str)> = HashMap::new();
    for (at, (key, id)) in deliveries.iter().enumerate() {
        first.entry(id.as_str()).or_insert((at, key.as_str()));
    }
    for order in placed {
        let mut previous: Option<(usize, &str)> = None;
        for (kind, id) in &order.events {
            let Some(&(at, key)) = first.get(id.as_str()) else {
                panic!("{kind} {id} of order {} never delivered", order.order_id);
            };
            assert_eq!(
                key, order.order_id,
                "{kind} {id} delivered under another key"
            );
            if let Some((before, before_kind)) = previous {
                assert!(
                    at > before,
                    "order {}: {kind} delivered (#{at}) before its {before_kind} (#{before})",
                    order.order_id
                );
            }
            previous = Some((at, *kind));
        }
    }
    deliveries.len() - first.len()
}
