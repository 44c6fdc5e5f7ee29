//! A PostgreSQL failover mid-run: a primary with a synchronous streaming standby of the
//! test's own (`common::pg_pair`), `km0 run pedidos`, `relay` and two `inventario` given both
//! servers in one URL (`postgres://…@primary,standby`, which entrega reads as libpq does,
//! wanting read-write sessions), the log transport in the same servers, and orders posted
//! over HTTP in a stream. The test kills the primary with SIGKILL with work in hand, waits as
//! a failover manager would, and promotes the standby.
//!
//! Run with the polling relay and with the WAL relay. Asserted: no process restarted or was told anything; orders are stored and applied again
//! on the promoted standby (the time from the kill is printed); every order answered 201 is
//! stored, each stored order applied exactly once and no other, the stock the start less the
//! stored orders, the outbox drained, nothing dead-lettered; and the servers really changed
//! roles (the one the state is read from at the end is the old standby, out of recovery);
//! with the WAL relay, that it streams from a slot on the promoted standby at the end.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use entrega::db::query;

use common::pg_pair::PgPair;
use common::process::Deployment;
use common::state::DbState;
use common::stream::{assert_applied_once, Posting};

const LEASE_TTL_MS: u64 = 1_000;
const SETTLE: Duration = Duration::from_secs(90);
const PREFIX: &str = "P-PGFO";
/// How long no server takes writes: the primary is dead and the standby not yet promoted,
/// as while a failover manager makes sure the primary is gone.
const LEADERLESS: Duration = Duration::from_secs(3);

/// Orders stored and effects applied so far, or `None` while no server answers.
async fn progress(state: &DbState) -> Option<(i64, i64)> {
    let stored = state
        .pedidos
        .scalar::<i64>(query(
            "SELECT COUNT(*) FROM outbox WHERE tipo = 'pedido.creado'",
        ))
        .await
        .ok()
        .flatten()?;
    let applied = state
        .inventario
        .scalar::<i64>(query("SELECT COUNT(*) FROM mensajes_procesados"))
        .await
        .ok()
        .flatten()?;
    Some((stored, applied))
}

/// Milliseconds from `after` (Unix ms) to the first time in `column` of `table` past it, as
/// the server recorded it.
async fn first_after(db: &entrega::Db, table: &str, column: &str, after: i64) -> Option<i64> {
    db.scalar::<i64>(
        query(format!(
            "SELECT CAST(EXTRACT(EPOCH FROM MIN({column})) * 1000 AS BIGINT) - $1 FROM {table} \
             WHERE {column} > to_timestamp($1 / 1000.0)"
        ))
        .bind(after),
    )
    .await
    .unwrap()
}

fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit")
}

/// The port of the server `state`'s pedidos database is on, and whether it is a standby.
async fn serving(state: &DbState) -> (i32, bool) {
    let port = state
        .pedidos
        .scalar::<i32>(query("SELECT inet_server_port()"))
        .await
        .unwrap()
        .unwrap();
    let standby = state
        .pedidos
        .scalar::<bool>(query("SELECT pg_is_in_recovery()"))
        .await
        .unwrap()
        .unwrap();
    (port, standby)
}

/// Whether pedidos' outbox has a replication slot on the server serving now, and whether a
/// relay streams from it.
async fn slot_streaming(state: &DbState) -> (bool, bool) {
    state
        .pedidos
        .fetch_optional::<(bool, bool)>(query(
            "SELECT true, COALESCE(bool_or(active), false) FROM pg_replication_slots \
             WHERE database = current_database() HAVING COUNT(*) > 0",
        ))
        .await
        .unwrap()
        .unwrap_or((false, false))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_killed_under_the_polling_relay_loses_no_acknowledged_order() {
    failover("poll", 0x7066_6f76).await;
}

/// With PostgreSQL 15 the slot is not on the standby: the relay finds it missing on a server
/// promoted since it was created, publishes the rows still pending from a snapshot and
/// streams from a new slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_killed_under_the_wal_relay_loses_no_acknowledged_order() {
    failover("wal", 0x7066_7761).await;
}

async fn failover(source: &str, seed: u64) {
    let pair = PgPair::start();
    let [primary, standby] = pair.addresses();
    let deployment = Deployment::on_postgres(&pair.url(), LEASE_TTL_MS);
    let (state, start) = deployment.stocked_state().await;
    assert_eq!(
        serving(&state).await,
        (port_of(&primary), false),
        "the primary serves first"
    );
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let mut relay = deployment
        .start_with_env("relay", "relay-1", &[("KM0_RELAY_SOURCE", source)])
        .await;
    let mut members = deployment
        .start_each("inventario", &["inventario-a", "inventario-b"])
        .await;
    let posting = Posting::start(pedidos.http_addr(), PREFIX, seed, 600, 40);
    posting
        .answered_at_least(150, Duration::from_secs(90))
        .await;
    // The kill lands with work in hand: an order still in the outbox or not yet applied.
    // Orders keep coming, so this is a matter of a few milliseconds at most.
    let mut in_hand = false;
    for _ in 0..400 {
        if state.pending().await > 0 || !state.consumer_caught_up().await {
            in_hand = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (stored_before, applied_before) = progress(&state).await.expect("progress");
    if source == "wal" {
        assert_eq!(
            slot_streaming(&state).await,
            (true, true),
            "the WAL relay streams first"
        );
    }

    pair.kill_primary();
    let killed_at = Instant::now();
    let killed_ms = unix_ms();
    eprintln!("killed the primary {primary} with {stored_before} orders stored");
    tokio::time::sleep(LEADERLESS).await;
    pair.promote_standby();
    let promoted_ms = unix_ms() - killed_ms;
    eprintln!(
        "promoted the standby {standby} {:?} after the kill",
        killed_at.elapsed()
    );
    let (mut stored_again, mut applied_again) = (None, None);
    while (stored_again.is_none() || applied_again.is_none())
        && killed_at.elapsed() < Duration::from_secs(90)
    {
        if let Some((stored, applied)) = progress(&state).await {
            if stored > stored_before && stored_again.is_none() {
                stored_again = Some(killed_at.elapsed());
            }
            if applied > applied_before && applied_again.is_none() {
                applied_again = Some(killed_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "after the kill: orders stored again after {stored_again:?}, applied again after \
         {applied_again:?}"
    );
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    let answered_201 = accepted.iter().flatten().count();
    eprintln!(
        "{source} relay: {answered_201} of {} orders answered 201",
        orders.len()
    );

    assert!(in_hand, "the kill found no work in hand");
    assert!(stored_again.is_some(), "no order stored after the failover");
    assert!(
        applied_again.is_some(),
        "no order applied after the failover"
    );
    assert_applied_once(
        &state, PREFIX, &orders, &accepted, &start, SETTLE, "failover",
    )
    .await;
    assert_eq!(
        serving(&state).await,
        (port_of(&standby), false),
        "the promoted standby serves at the end"
    );
    // When the service wrote, published and applied again, as the servers recorded it.
    let report = serde_json::json!({
        "relay_source": source,
        "promoted_after_ms": promoted_ms,
        "stored_again_after_ms": first_after(&state.pedidos, "outbox", "creado_en", killed_ms).await,
        "published_again_after_ms":
            first_after(&state.pedidos, "outbox", "publicado_en", killed_ms).await,
        "applied_again_after_ms":
            first_after(&state.inventario, "mensajes_procesados", "procesado_en", killed_ms).await,
        "orders": orders.len(),
        "answered_201": answered_201,
    });
    common::write_measurements(&format!("pg_failover_{source}"), &report);
    if source == "wal" {
        assert_eq!(
            slot_streaming(&state).await,
            (true, true),
            "the WAL relay streams from a new slot on the promoted standby"
        );
    }
    relay.assert_running();
    members.iter_mut().for_each(|m| m.assert_running());
    for process in members.into_iter().chain([relay, pedidos]) {
        process.terminate().await;
    }
    state.close().await;
    deployment.destroy().await;
}

fn port_of(address: &str) -> i32 {
    address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}
