//! Rebalance with messages in flight, on Kafka, with real processes: a backlog of orders
//! (each a `pedido.creado` and a `pedido.pagado`) waits in km0's six-partition topic on an
//! Apache Kafka broker of the test's own; one `km0 run inventario` starts working through it.
//!
//! The test holds a brake: a transaction of its own that locks one product's stock row, so
//! every consumer transaction that takes that product waits, its batch in flight (uncommitted,
//! offsets not committed). The waiting transactions are counted in `pg_stat_activity`: one
//! per consumer with a batch in flight.
//!
//! 1. The first consumer works alone, then the brake stops it mid-batch.
//! 2. A second and a third consumer start while its batch is in flight: partitions must move
//!    to them (cooperative rebalance) without losing or doubling anything. The brake is let
//!    go and put on again until all three consumers have a batch in flight, which shows each
//!    of them holds partitions with work.
//! 3. One is stopped with SIGTERM (it finishes its batch once the brake goes, commits, leaves)
//!    and another killed with SIGKILL (its transaction never commits; its partitions go to the
//!    last consumer after the session timeout, from the last committed offsets).
//!
//! At the end every order is applied exactly once, each partition in offset order
//! (`common::kafka_state::checks`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use common::kafka_state::checks::{assert_applied_exactly_once_in_order, wait_settled};
use common::kafka_state::orders::{all_accepted, Load};
use common::kafka_state::{KafkaRig, KafkaView};
use common::state::eventually;
use entrega::Db;
use km0::services::inventario::GROUP;
use km0::services::pedidos::TOPIC;
use sqlx::{PgPool, Postgres, Transaction};

/// Records per poll of the test's consumers: the backlog must be many batches, so every
/// consumer that joins finds work (with km0's default of 1000, three polls take it all).
const MAX_BATCH: (&str, &str) = ("KM0_MAX_BATCH", "100");

/// Orders in the backlog (two events each), and how fast they are placed.
const BACKLOG: usize = 1500;
const PER_SECOND: u32 = 300;
/// The product whose stock row the brake locks (in about two orders of five).
const BRAKE_PRODUCT: &str = "tomate-rosa";
/// How long the brake stays on while the new consumers join: long enough for the group's
/// first round (a few seconds), which asks the first consumer to give partitions
/// up; it can only do so once its batch is done.
const JOINING: Duration = Duration::from_secs(6);
/// How long the brake is let go at a time until every consumer has a batch in flight.
const PULSE: Duration = Duration::from_millis(100);
/// How long each pulse waits, the brake on, for all three consumers to be held.
const PULSE_WAIT: Duration = Duration::from_secs(5);
/// Longest wait for consumers to reach an expected state.
const WITHIN: Duration = Duration::from_secs(45);
/// Longest wait for everything to be consumed at the end.
const SETTLE: Duration = Duration::from_secs(90);

/// A transaction of the test's own holding the lock of one stock row.
struct Brake {
    pool: PgPool,
    tx: Option<Transaction<'static, Postgres>>,
}

impl Brake {
    fn new(inventario: &Db) -> Self {
        let Some(pool) = inventario.postgres() else {
            panic!("the Kafka process tests run on PostgreSQL");
        };
        Self {
            pool: pool.clone(),
            tx: None,
        }
    }

    /// Locks the row (waiting for a consumer transaction that holds it to end). One row only:
    /// holding nothing else and waiting for nothing once it has it, the brake can never be
    /// part of a deadlock.
    async fn engage(&mut self) {
        let mut tx = self.pool.begin().await.expect("begin");
        sqlx::query("SELECT unidades FROM stock WHERE producto = $1 FOR UPDATE")
            .bind(BRAKE_PRODUCT)
            .fetch_one(&mut *tx)
            .await
            .expect("lock the stock row");
        self.tx = Some(tx);
    }

    async fn release(&mut self) {
        if let Some(tx) = self.tx.take() {
            tx.commit().await.expect("release the brake");
        }
    }

    /// Transactions of the inventario database waiting for a lock: consumers with a batch in
    /// flight, stopped by the brake.
    async fn waiting(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&self.pool)
        .await
        .expect("pg_stat_activity")
    }

    /// Waits until `n` consumer transactions are held by the brake.
    async fn until_waiting(&self, n: i64, what: &str) {
        eventually(WITHIN, what, || async {
            (self.waiting().await == n).then_some(())
        })
        .await;
    }
}

async fn committed_total(view: &KafkaView) -> i64 {
    view.committed(GROUP, TOPIC).await.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_with_batches_in_flight_without_loss_or_double_effect() {
    let KafkaRig {
        broker: _broker,
        deployment,
        state,
        view,
        start,
    } = KafkaRig::start().await;

    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let relay = deployment.start("relay", "relay-1").await;
    let load = Load::start(
        pedidos.http_addr(),
        state.pedidos.clone(),
        "P-RB",
        PER_SECOND,
        BACKLOG,
        0x6b6d_3046,
    );
    let placed = all_accepted(&load.finish().await);
    let events = i64::try_from(placed.len() * 2).unwrap();
    eventually(WITHIN, "the backlog published", || async {
        (state.pending().await == 0 && view.ends(TOPIC).await.values().sum::<i64>() >= events)
            .then_some(())
    })
    .await;

    // 1. One consumer works through the backlog, until the brake stops it mid-batch.
    let mut brake = Brake::new(&state.inventario);
    let first = deployment
        .start_with_env("inventario", "inventario-a", &[MAX_BATCH])
        .await;
    eventually(WITHIN, "the first consumer at work", || async {
        (committed_total(&view).await >= events / 10).then_some(())
    })
    .await;
    brake.engage().await;
    brake
        .until_waiting(1, "the first consumer's batch held in flight")
        .await;
    let before_join = committed_total(&view).await;
    assert!(
        before_join < events,
        "the backlog was consumed before the brake"
    );

    // 2. Two more consumers join while that batch is in flight.
    let second = deployment
        .start_with_env("inventario", "inventario-b", &[MAX_BATCH])
        .await;
    let third = deployment
        .start_with_env("inventario", "inventario-c", &[MAX_BATCH])
        .await;
    tokio::time::sleep(JOINING).await;
    assert_eq!(
        committed_total(&view).await,
        before_join,
        "offsets were committed while every batch was held"
    );
    brake.release().await;
    // The first consumer finishes its batch and gives partitions up; the others get them
    // in the next round. Let everyone run a moment at a time until all three consumers are
    // held with a batch in flight: each of them then holds partitions with work.
    let mut pulses = 0;
    loop {
        tokio::time::sleep(PULSE).await;
        brake.engage().await;
        pulses += 1;
        let all_three =
            entrega_testkit::wait_until(PULSE_WAIT, || async { brake.waiting().await == 3 }).await;
        if all_three {
            break;
        }
        assert!(
            pulses < 15,
            "never all three consumers with a batch in flight (waiting: {}, committed {} of \
             {events})",
            brake.waiting().await,
            committed_total(&view).await
        );
        brake.release().await;
    }
    let held_everywhere = committed_total(&view).await;
    assert!(
        held_everywhere < events,
        "the backlog was consumed before all three had work in flight"
    );
    eprintln!(
        "{before_join} of {events} records committed when the others joined, \
         {held_everywhere} when all three had a batch in flight ({pulses} pulses)"
    );

    // 3. One stops cleanly, one dies, both with a batch in flight.
    let stopping = tokio::spawn(second.terminate());
    third.kill().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    brake.release().await;
    stopping.await.expect("SIGTERM'd consumer");

    wait_settled(
        &state,
        &view,
        SETTLE,
        "the last consumer to consume everything",
    )
    .await;
    let mut first = first;
    first.assert_running();
    assert_applied_exactly_once_in_order(&state, &view, &placed, &start).await;

    first.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}
