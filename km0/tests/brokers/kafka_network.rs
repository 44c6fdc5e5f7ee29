//! A bad network between the services and the broker, with real processes: `km0 run
//! pedidos`, `relay` and `inventario` reach an Apache Kafka broker of the test's own through
//! a TCP proxy that first slows every chunk down, then stops moving bytes altogether without
//! closing anything (packets silently dropped: no refusal, no reset, only silence), then
//! heals, while orders keep coming, each followed by its `pedido.pagado`.
//!
//! Every order is accepted throughout (the outbox decouples pedidos from the broker); once the
//! network heals, everything is published and consumed by the same processes, each order
//! applied exactly once and each order's events in order (`common::kafka_state::checks`). The
//! faults are checked too: chunks were delayed, chunks waited in the black hole, and events
//! were committed while it lasted.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use common::kafka::KafkaBroker;
use common::kafka_state::checks::{assert_applied_exactly_once_in_order, wait_settled};
use common::kafka_state::orders::{all_accepted, fill_stock, Load, Placed};
use common::kafka_state::{databases_without_kafka, KafkaView, LEASE_TTL_MS, SESSION_TIMEOUT_MS};
use common::process::Deployment;
use common::proxy::Proxy;

const PER_SECOND: u32 = 30;
const SLOW: Duration = Duration::from_millis(150);
const SLOW_FOR: Duration = Duration::from_secs(8);
/// Longer than the group's session and the clients' request timeouts.
const HOLE_FOR: Duration = Duration::from_secs(15);
const SETTLE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_then_black_holed_network_loses_nothing_and_applies_once_in_order() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let proxy_addr = listener.local_addr().expect("proxy addr");
    let kafka = KafkaBroker::start_advertising(proxy_addr.port());
    let proxy = Proxy::start_on(listener, proxy_addr, kafka.addr());
    let url = format!(
        "kafka://{proxy_addr}?session_timeout_ms={SESSION_TIMEOUT_MS}&request_timeout_ms=5000\
         &delivery_timeout_ms=10000"
    );
    let deployment = Deployment::with_broker("postgres", &url, LEASE_TTL_MS);
    let state = databases_without_kafka(&deployment).await;
    let view = KafkaView::new(proxy_addr.to_string());
    let start = fill_stock(&state).await;

    let mut pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay = deployment.start("relay", "relay-1").await;
    let mut consumer = deployment.start("inventario", "inventario-1").await;
    let addr = pedidos.http_addr();
    let load = Load::start(
        addr,
        state.pedidos.clone(),
        "P-NET",
        PER_SECOND,
        usize::MAX,
        0x6e65_7477,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    proxy.slow(SLOW);
    tokio::time::sleep(SLOW_FOR).await;
    proxy.black_hole();
    let hole_at = Instant::now();
    let pending_at_hole = state.pending().await;
    tokio::time::sleep(HOLE_FOR).await;
    let pending_in_hole = state.pending().await;
    proxy.heal();
    let healed_in = hole_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outcomes = load.stop().await;
    let placed: Vec<Placed> = all_accepted(&outcomes);
    let in_hole = outcomes
        .iter()
        .filter(|o| o.sent >= hole_at && o.answered <= hole_at + healed_in)
        .count();

    // The faults happened: chunks waited, and orders kept coming while nothing moved.
    assert!(proxy.delayed() > 0, "no chunk was slowed down");
    assert!(proxy.swallowed() > 0, "nothing waited in the black hole");
    assert!(
        in_hole > 0,
        "no order was placed while the network was a black hole"
    );
    assert!(
        pending_in_hole > pending_at_hole,
        "the outbox did not grow while the broker was unreachable ({pending_at_hole} → \
         {pending_in_hole})"
    );
    wait_settled(&state, &view, SETTLE, "everything published and consumed").await;
    for process in [&mut pedidos, &mut relay, &mut consumer] {
        process.assert_running();
    }
    let summary = assert_applied_exactly_once_in_order(&state, &view, &placed, &start).await;
    eprintln!(
        "network faults: {} orders ({in_hole} during the black hole), {} chunks delayed, \
         {} swallowed, outbox {pending_at_hole} → {pending_in_hole}; log {summary:?}",
        placed.len(),
        proxy.delayed(),
        proxy.swallowed()
    );
    consumer.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
    drop(proxy);
}
