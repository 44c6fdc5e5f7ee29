//! A quick measure of per-key concurrency, printed on demand.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use entrega_core::SystemClock;
use entrega_testkit::wait_until;
use support::keys_steps::{keyed, publish_interleaved, router};
use support::observed::Observed;
use support::worker_steps::{caught_up, Running, TOPIC};
use support::{Backend, Env};
use tokio::time::Instant;

/// A quick measure, not a benchmark: 2,000 messages over 50 keys on one partition, a handler
/// taking 2 ms per message, with one key at a time and with 16.
/// `cargo test -p entrega --release --test worker_keys_measure -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints a measure; run on demand"]
async fn measure_key_concurrency() {
    let keys: Vec<String> = (0..50).map(|k| format!("P-{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (n, max_batch) in [(1, 100), (16, 100), (1, 500), (16, 500)] {
        let env = Env::new(Backend::Memory, Arc::new(SystemClock)).await;
        env.log.admin().ensure_topic(TOPIC, 1).await.unwrap();
        publish_interleaved(&env, &keys, 40).await;
        let handler = Arc::new(Observed::ok(Duration::from_millis(2)));
        let mut cfg = keyed(n);
        cfg.max_batch = max_batch;
        let started = Instant::now();
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            cfg,
        );
        let log = env.log.as_ref();
        assert!(wait_until(Duration::from_secs(120), || caught_up(log)).await);
        let elapsed = started.elapsed();
        let stats = running.stats.clone();
        running.stop().await;
        assert_eq!(handler.applied().len(), 2000);
        println!(
            "key_concurrency={n:>2} max_batch={max_batch}: {:>6.0} ms, {:>6.0} msg/s, \
             max in flight {}",
            elapsed.as_secs_f64() * 1000.0,
            2000.0 / elapsed.as_secs_f64(),
            stats.max_in_flight()
        );
    }
}
