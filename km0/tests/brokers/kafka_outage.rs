//! A broker outage, with real processes: `km0 run pedidos`, `relay` and `inventario` reach
//! an Apache Kafka broker of the test's own through a TCP proxy the test cuts for 60 s
//! (`KM0_OUTAGE_SECS` shortens it for a local run) while orders keep coming at a steady
//! rate, each followed by its `pedido.pagado`.
//!
//! During the outage pedidos keeps accepting orders (every POST answered 201: the outbox
//! decouples it from the broker), the outbox backlog grows by every event committed (none can
//! have been confirmed by the broker, so none may be marked published), and no client
//! hammers the broker: the connections the proxy refuses stay within what capped reconnect
//! backoffs allow, and the relay process uses little CPU. Once the proxy is restored the
//! outbox drains and every order is applied exactly once, in order
//! (`common::kafka_state::checks`), by the same processes, still running.
//!
//! The largest backlog and the times from restore to drained outbox and to consumed topic are
//! printed and written to `target/km0-measurements/kafka_outage.json` (`kafka_outage_wal.json`
//! for the same outage under the WAL relay, whose slot is checked to hold the outage's WAL).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use common::kafka::KafkaBroker;
use common::kafka_state::checks::{assert_applied_exactly_once_in_order, settled, wait_settled};
use common::kafka_state::orders::{all_accepted, fill_stock, Load, Outcome, Placed};
use common::kafka_state::{databases_without_kafka, KafkaView, LEASE_TTL_MS, SESSION_TIMEOUT_MS};
use common::process::{Deployment, Km0};
use common::proxy::Proxy;
use common::state::DbState;
use serde_json::json;

/// The outage asked for; `KM0_OUTAGE_SECS` overrides it.
const OUTAGE_SECS: u64 = 60;
/// Orders per second, before and during the outage.
const PER_SECOND: u32 = 50;
/// Steady load before the cut.
const BEFORE_CUT: Duration = Duration::from_secs(5);
/// How often the backlog and the refused connections are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Time for the proxy to close the connections that were open at the cut.
const CUT_SETTLES: Duration = Duration::from_millis(500);
/// Longest wait for the backlog to drain and be consumed after the restore.
const DRAIN_WITHIN: Duration = Duration::from_secs(120);
/// librdkafka's reconnect backoff (`reconnect.backoff.ms`, `reconnect.backoff.max.ms`
/// defaults): each broker connection of a client is retried no sooner than the backoff after
/// the last attempt, doubling from the first to the cap, with jitter of -25 % to +50 %.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_CAP: Duration = Duration::from_secs(10);
/// Broker connections the three processes may hold at most: per process a producer, an admin
/// client and (inventario) a group member, each with a bootstrap and a broker connection.
const CONNECTIONS: u64 = 12;
/// Share of one core the relay may use on average during the outage.
const RELAY_CPU_SHARE: f64 = 0.25;

fn outage() -> Duration {
    let secs = std::env::var("KM0_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(OUTAGE_SECS);
    Duration::from_secs(secs)
}

/// Most connection attempts one connection makes in `span` while the broker is unreachable:
/// the schedule of [`RECONNECT_FIRST`] doubling up to [`RECONNECT_CAP`], each delay at its
/// shortest (-25 %), plus the first attempt.
fn max_attempts(span: Duration) -> u64 {
    let (mut at, mut delay, mut attempts) = (Duration::ZERO, RECONNECT_FIRST, 1);
    loop {
        at += delay.mul_f64(0.75);
        if at > span {
            return attempts;
        }
        attempts += 1;
        delay = (delay * 2).min(RECONNECT_CAP);
    }
}

/// CPU time (user and system) `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process stat");
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat format")
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second: u64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100);
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Time from `since` until `done` holds, or `None` after [`DRAIN_WITHIN`].
async fn until<F, Fut>(since: Instant, mut done: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    while since.elapsed() < DRAIN_WITHIN {
        if done().await {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// What was seen while the proxy was cut.
struct During {
    /// When every connection through the proxy had been closed.
    cut_at: Instant,
    largest_backlog: i64,
    backlog_at_restore: i64,
    /// When the query that read `backlog_at_restore` was sent.
    sampled_at: Instant,
    refused: u64,
    refused_second_half: u64,
    relay_cpu: Duration,
}

async fn cut_for(outage: Duration, proxy: &Proxy, state: &DbState, relay: &Km0) -> During {
    let relay_cpu = cpu_time(relay.pid());
    proxy.cut();
    // Open connections close asynchronously; bytes already in flight may still pass.
    tokio::time::sleep(CUT_SETTLES).await;
    let cut_at = Instant::now();
    let mut largest_backlog = 0;
    let mut refused_at_half = None;
    let (backlog_at_restore, sampled_at) = loop {
        // Taken before the query: an order answered by then is in the query's snapshot.
        let sampled_at = Instant::now();
        let backlog = state.pending().await;
        largest_backlog = largest_backlog.max(backlog);
        if refused_at_half.is_none() && cut_at.elapsed() >= outage / 2 {
            refused_at_half = Some(proxy.refused());
        }
        if cut_at.elapsed() + SAMPLE_EVERY >= outage {
            break (backlog, sampled_at);
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    };
    tokio::time::sleep(outage.saturating_sub(cut_at.elapsed())).await;
    let relay_cpu = cpu_time(relay.pid()) - relay_cpu;
    let refused = proxy.refused();
    During {
        cut_at,
        largest_backlog,
        backlog_at_restore,
        sampled_at,
        refused,
        refused_second_half: refused - refused_at_half.unwrap_or(0),
        relay_cpu,
    }
}

// A 60 s outage outlasts the producer's 30 s delivery timeout: the publisher must replace a
// producer the broker fenced, and the consumer must not back off on broker-down events that
// were queued during the outage once the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_accepted_through_a_broker_outage_then_applied_once_in_order() {
    through_an_outage(&[]).await;
}

/// The same with the WAL relay: its slot holds the WAL of every event committed during the
/// outage (none confirmed), and it drains in order after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_relay_through_a_broker_outage_holds_the_slot_then_drains() {
    through_an_outage(&[("KM0_RELAY_SOURCE", "wal")]).await;
}

/// WAL written past the position pedidos' slot confirmed, in bytes (`None`: no slot).
async fn slot_lag_bytes(state: &DbState) -> Option<i64> {
    state
        .pedidos
        .scalar::<i64>(entrega::db::query(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE database = current_database()",
        ))
        .await
        .unwrap()
}

async fn through_an_outage(relay_env: &[(&str, &str)]) {
    let wal = !relay_env.is_empty();
    let outage = outage();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let proxy_addr = listener.local_addr().expect("proxy addr");
    let kafka = KafkaBroker::start_advertising(proxy_addr.port());
    let proxy = Proxy::start_on(listener, proxy_addr, kafka.addr());
    let url = format!("kafka://{proxy_addr}?session_timeout_ms={SESSION_TIMEOUT_MS}");
    let deployment = Deployment::with_broker("postgres", &url, LEASE_TTL_MS);
    let state = databases_without_kafka(&deployment).await;
    let view = KafkaView::new(proxy_addr.to_string());
    let start = fill_stock(&state).await;

    let mut pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay = deployment
        .start_with_env("relay", "relay-1", relay_env)
        .await;
    let mut consumer = deployment.start("inventario", "inventario-1").await;
    let (addr, db) = (pedidos.http_addr(), state.pedidos.clone());
    let warm_up = Load::start(addr, db.clone(), "P-WARM", PER_SECOND, 20, 1).finish();
    let mut placed: Vec<Placed> = all_accepted(&warm_up.await);
    wait_settled(
        &state,
        &view,
        Duration::from_secs(60),
        "the warm-up orders consumed",
    )
    .await;

    let load = Load::start(addr, db, "P-OUT", PER_SECOND, usize::MAX, 0x6b6d_3047);
    tokio::time::sleep(BEFORE_CUT).await;
    assert_eq!(proxy.refused(), 0, "connections refused before the cut");
    let lag_before = slot_lag_bytes(&state).await;
    let during = cut_for(outage, &proxy, &state, &relay).await;
    let cut_at = during.cut_at;
    let lag_at_restore = slot_lag_bytes(&state).await;
    proxy.restore();
    let restored_at = Instant::now();
    let outcomes: Vec<Outcome> = load.stop().await;

    // Measured before anything is asserted, so a failing run still reports its numbers.
    let bound = CONNECTIONS * max_attempts(outage);
    let half_bound = CONNECTIONS * max_attempts(outage / 2);
    let drained = until(restored_at, || async { state.pending().await == 0 }).await;
    let consumed = until(restored_at, || settled(&state, &view)).await;
    let in_outage = outcomes
        .iter()
        .filter(|o| o.sent >= cut_at && o.answered <= restored_at)
        .count();
    let name = if wal {
        "kafka_outage_wal"
    } else {
        "kafka_outage"
    };
    common::write_measurements(
        name,
        &json!({
            "outage_secs": outage.as_secs(),
            "orders_per_second": PER_SECOND,
            "orders": placed.len() + outcomes.len(),
            "orders_during_outage": in_outage,
            "largest_backlog_events": during.largest_backlog,
            "backlog_at_restore_events": during.backlog_at_restore,
            "restore_to_outbox_drained_ms": drained.map(|d| d.as_millis()),
            "restore_to_all_consumed_ms": consumed.map(|d| d.as_millis()),
            "refused_connections": during.refused,
            "refused_connections_second_half": during.refused_second_half,
            "refused_connections_bound": bound,
            "refused_connections_second_half_bound": half_bound,
            "relay_cpu_ms_during_outage": during.relay_cpu.as_millis(),
        }),
    );
    if wal {
        // The slot held the outage's WAL: its confirmed position did not move past the events
        // the broker never confirmed.
        let (before, at_restore) = (lag_before.unwrap_or(0), lag_at_restore.unwrap_or(0));
        assert!(
            at_restore > before,
            "the slot's lag did not grow during the outage ({before} -> {at_restore} bytes)"
        );
        eprintln!("WAL relay slot lag: {before} bytes before the cut, {at_restore} at the restore");
    }
    // Orders placed while the proxy was cut: all accepted.
    assert!(in_outage > 0, "no order was placed during the outage");
    placed.extend(all_accepted(&outcomes));
    // Every event committed after the cut and before the last sample was still pending then.
    let committed_in_outage = 2 * outcomes
        .iter()
        .filter(|o| o.sent >= cut_at && o.answered <= during.sampled_at)
        .count();
    assert!(
        during.backlog_at_restore >= i64::try_from(committed_in_outage).unwrap(),
        "{committed_in_outage} events were committed while the broker was unreachable, but only \
         {} are pending: events were marked published without the broker's confirmation",
        during.backlog_at_restore
    );
    // No busy loop: reconnects within the capped backoffs, the relay mostly idle.
    assert!(
        during.refused <= bound && during.refused_second_half <= half_bound,
        "{} connections refused during the outage ({} in its second half); capped backoffs \
         allow at most {bound} ({half_bound})",
        during.refused,
        during.refused_second_half
    );
    let relay_share = during.relay_cpu.as_secs_f64() / outage.as_secs_f64();
    assert!(
        relay_share <= RELAY_CPU_SHARE,
        "the relay used {:.0} % of a core during the outage",
        relay_share * 100.0
    );
    for process in [&mut pedidos, &mut relay, &mut consumer] {
        process.assert_running();
    }
    let drained = drained.unwrap_or_else(|| {
        panic!(
            "the outbox did not drain within {DRAIN_WITHIN:?} of the restore ({} pending)",
            during.backlog_at_restore
        )
    });
    assert!(
        consumed.is_some(),
        "the topic was not consumed within {DRAIN_WITHIN:?} of the restore"
    );
    eprintln!("outbox drained {drained:?} after the restore");

    assert_applied_exactly_once_in_order(&state, &view, &placed, &start).await;

    consumer.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
    drop(proxy);
}
