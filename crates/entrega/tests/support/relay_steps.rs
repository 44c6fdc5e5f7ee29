//! Shared steps of the relay tests.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use entrega::{Backoff, RelayConfig};
use entrega_core::{Clock, Envelope, NewEvent};
use entrega_testkit::OutboxFixture;
use serde_json::json;
use uuid::Uuid;

use super::{all_records, Backend, Env};

pub const TOPIC: &str = "pedidos.eventos";
pub const TTL: Duration = Duration::from_secs(10);

pub fn config(instance: &str) -> RelayConfig {
    let mut config = RelayConfig::new("pedidos", super::routing());
    config.instance_id = instance.to_owned();
    config.batch_size = 2;
    config.lease_ttl = TTL;
    config.poll_interval = Duration::from_millis(20);
    config.backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(30)).with_jitter(0.0);
    config
}

pub fn events(aggregate_id: &str, ns: std::ops::Range<u32>) -> Vec<NewEvent> {
    ns.map(|n| NewEvent::new("pedido", aggregate_id, "pedido.creado", json!({ "n": n })))
        .collect()
}

pub async fn env_with_topic(backend: Backend, clock: Arc<dyn Clock>) -> Env {
    let env = Env::new(backend, clock).await;
    env.log.admin().ensure_topic(TOPIC, 3).await.unwrap();
    env
}

pub async fn published(outbox: &dyn OutboxFixture, events: &[NewEvent]) -> usize {
    let mut n = 0;
    for e in events {
        if outbox
            .row(e.id)
            .await
            .unwrap()
            .expect("row exists")
            .published
        {
            n += 1;
        }
    }
    n
}

/// Ids of the records of `TOPIC`, with how often each occurs.
pub async fn published_ids(env: &Env) -> HashMap<Uuid, usize> {
    let mut ids = HashMap::new();
    for r in all_records(env.log.as_ref(), TOPIC).await {
        *ids.entry(Envelope::parse(&r.payload).unwrap().id)
            .or_default() += 1;
    }
    ids
}

/// Asserts that the first delivery of each event (consumers skip repeats by id) comes in
/// each aggregate's order (`datos.n`); returns the ids delivered.
pub fn assert_first_deliveries_in_order(
    records: &[entrega_core::Record],
    label: &str,
) -> std::collections::HashSet<Uuid> {
    let mut seen = std::collections::HashSet::new();
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    for r in records {
        let envelope = Envelope::parse(&r.payload).unwrap();
        if seen.insert(envelope.id) {
            order
                .entry(r.key.clone().unwrap())
                .or_default()
                .push(envelope.data["n"].as_u64().unwrap());
        }
    }
    for (key, ns) in &order {
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, &sorted, "{label}: order of {key} broken");
    }
    seen
}
