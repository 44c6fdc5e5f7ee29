//! Two relays whose clocks disagree by more than a lease: the one whose clock runs ahead
//! sees the other's leases as expired and takes its lanes while it is publishing. Fencing
//! tokens stop the robbed relay from marking what it published, so those rows go out again
//! (duplicates, with the same ids) and nothing is lost. Checked on the in-memory outbox,
//! SQLite and PostgreSQL: every event is published, each aggregate's first deliveries keep
//! their order, and the steal really happened (leases lost, events published twice).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use entrega::{CancellationToken, Relay};
use entrega_core::{Clock, NewEvent, SystemClock};
use entrega_testkit::{wait_until, TxEnd};
use support::relay_steps::{
    assert_first_deliveries_in_order, config, env_with_topic, events, published_ids, TOPIC,
};
use support::{all_records, Backend};
use uuid::Uuid;

/// The system clock moved by a fixed offset: a machine whose clock is wrong.
#[derive(Debug)]
struct Skewed(i64);

impl Clock for Skewed {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0
    }
}

const LEASE: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_with_skewed_clocks_lose_nothing_and_keep_order() {
    for backend in [Backend::Memory, Backend::Sqlite, Backend::Postgres] {
        let env = env_with_topic(backend, Arc::new(SystemClock)).await;
        let token = CancellationToken::new();
        let start = |name: &str, clock: Arc<dyn Clock>, token: &CancellationToken| {
            let mut cfg = config(name);
            cfg.lease_ttl = LEASE;
            cfg.batch_size = 5;
            let relay = Arc::new(Relay::new(env.ports(), env.log.publisher(), clock, cfg));
            let (r, t) = (relay.clone(), token.clone());
            (relay, tokio::spawn(async move { r.run(t).await }))
        };
        // The relay on time takes every lane first.
        let (honest, honest_task) = start("on-time", Arc::new(SystemClock), &token);
        let holds_every_lane = || async { honest.lanes().await.len() == 64 };
        assert!(wait_until(Duration::from_secs(20), holds_every_lane).await);
        // Then one whose clock runs three leases ahead joins, while events keep coming. It
        // takes its share of lanes at its first balance; the relay on time loses a lease
        // (a mark fenced) only if it drains one of those lanes before its own next balance.
        // Until that has happened, the relay ahead leaves and joins again every second, each
        // time taking lanes anew (at least twelve rounds, for at most 45 s).
        let ahead = i64::try_from(LEASE.as_millis()).unwrap() * 3;
        let mut skewed = Vec::new();
        let mut joined = std::time::Instant::now();
        let mut current = Some({
            let own = token.child_token();
            let (relay, task) = start("ahead", Arc::new(Skewed(ahead)), &own);
            (relay, task, own)
        });
        let mut produced: Vec<NewEvent> = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(45);
        for round in 0.. {
            let taken = honest.stats().leases_lost.load(Ordering::SeqCst) > 0;
            if round >= 12 && (taken || std::time::Instant::now() > until) {
                break;
            }
            if !taken && joined.elapsed() > Duration::from_secs(1) {
                if let Some((relay, task, own)) = current.take() {
                    own.cancel();
                    task.await.unwrap().unwrap();
                    skewed.push(relay);
                }
                assert!(wait_until(Duration::from_secs(20), holds_every_lane).await);
                let own = token.child_token();
                let (relay, task) = start("ahead", Arc::new(Skewed(ahead)), &own);
                current = Some((relay, task, own));
                joined = std::time::Instant::now();
            }
            let batch: Vec<NewEvent> = (0..20)
                .flat_map(|a| events(&format!("A-{a}"), round..round + 1))
                .collect();
            env.outbox.enqueue(&batch, TxEnd::Commit).await.unwrap();
            produced.extend(batch);
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        let expected: HashSet<Uuid> = produced.iter().map(|e| e.id).collect();
        assert!(
            wait_until(Duration::from_secs(30), || async {
                let ids = published_ids(&env).await;
                expected.iter().all(|id| ids.contains_key(id))
            })
            .await,
            "{backend:?}: events lost"
        );
        token.cancel();
        honest_task.await.unwrap().unwrap();
        if let Some((relay, task, _)) = current.take() {
            task.await.unwrap().unwrap();
            skewed.push(relay);
        }

        // The fault happened: the relay on time had lanes taken from it.
        let lost = honest.stats().leases_lost.load(Ordering::SeqCst);
        assert!(lost > 0, "{backend:?}: no lease was taken over");
        let published_ahead: u64 = skewed.iter().map(|r| r.stats().published()).sum();
        assert!(published_ahead > 0, "{backend:?}");
        // Nothing is lost, and first deliveries keep each aggregate's order.
        let records = all_records(env.log.as_ref(), TOPIC).await;
        let seen = assert_first_deliveries_in_order(&records, &format!("{backend:?}"));
        assert_eq!(seen, expected, "{backend:?}: events lost or unknown");
        eprintln!(
            "{backend:?}: {} events, {} records, {lost} leases lost by the relay on time",
            expected.len(),
            records.len()
        );
        env.finish().await;
    }
}
