//! `km0 lab`: each scenario's naive side shows the failure the seed describes, read from its
//! rows, and the pattern, under the very same faults, loses nothing and applies nothing twice.
//! The same seed gives the same run.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use km0::lab::{find, run, Brokers, Ledger};

/// The test servers (`scripts/test` exports where they are), or the lab's defaults.
fn brokers() -> Brokers {
    let mut brokers = Brokers::default();
    if let Ok(kafka) = std::env::var("ENTREGA_TEST_KAFKA") {
        brokers.kafka = kafka;
    }
    if let Ok(amqp) = std::env::var("ENTREGA_TEST_AMQP") {
        brokers.rabbitmq = amqp;
    }
    if let Ok(redis) = std::env::var("ENTREGA_TEST_REDIS") {
        brokers.redis = redis;
    }
    brokers.km0 = Some(env!("CARGO_BIN_EXE_km0").into());
    brokers
}

async fn ledgers(name: &str, seed: u64) -> (Ledger, Ledger) {
    let mut outcomes = run(&find(name).unwrap(), seed, &brokers()).await.unwrap();
    assert_eq!(outcomes.len(), 1);
    let outcome = outcomes.remove(0);
    assert_eq!(outcome.skipped, None, "{name} must run here");
    (outcome.naive, outcome.pattern)
}

/// The pattern's side: every order applied exactly once, nothing left behind.
fn kept_everything(name: &str, pattern: &Ledger) {
    assert!(pattern.placed > 0, "{name}: {pattern:?}");
    assert_eq!(pattern.applied, pattern.placed, "{name}: {pattern:?}");
    assert_eq!(
        (
            pattern.lost,
            pattern.doubled,
            pattern.out_of_order,
            pattern.stuck
        ),
        (0, 0, 0, 0),
        "{name}: {pattern:?}"
    );
}

#[tokio::test]
async fn acknowledging_first_loses_the_orders_the_kills_hit() {
    let (naive, pattern) = ledgers("ack-before-processing", 7).await;
    assert_eq!(naive.lost, 3, "one order lost per kill: {naive:?}");
    assert_eq!(naive.doubled, 0, "{naive:?}");
    assert_eq!(naive.applied, naive.placed - 3, "{naive:?}");
    kept_everything("ack-before-processing", &pattern);
    assert!(
        pattern.fault.contains("killed 3 times"),
        "{}",
        pattern.fault
    );
}

#[tokio::test]
async fn without_a_key_the_redelivered_orders_take_stock_twice() {
    let (naive, pattern) = ledgers("no-deduplication", 7).await;
    assert_eq!(naive.doubled, 3, "one repeat per kill: {naive:?}");
    assert_eq!(naive.lost, 0, "{naive:?}");
    assert_eq!(naive.applied, naive.placed + 3, "{naive:?}");
    kept_everything("no-deduplication", &pattern);
}

#[tokio::test]
async fn a_key_in_its_own_transaction_loses_the_effect() {
    let (naive, pattern) = ledgers("key-in-another-transaction", 7).await;
    assert_eq!(naive.lost, 3, "{naive:?}");
    assert_eq!(naive.doubled, 0, "{naive:?}");
    kept_everything("key-in-another-transaction", &pattern);
}

#[tokio::test]
async fn an_order_committed_before_its_publish_is_never_heard_of_without_the_outbox() {
    let (naive, pattern) = ledgers("dual-write-crash", 7).await;
    assert_eq!(naive.placed, 60, "every order was stored: {naive:?}");
    assert_eq!(
        naive.lost, 3,
        "no event for the orders the kills hit: {naive:?}"
    );
    assert_eq!(naive.ghosts, 0, "{naive:?}");
    kept_everything("dual-write-crash", &pattern);
    assert_eq!(pattern.placed, 60);
}

#[tokio::test]
async fn an_event_published_inside_a_rolled_back_transaction_is_a_ghost() {
    let (naive, pattern) = ledgers("dual-write-rollback", 7).await;
    assert_eq!(
        naive.placed, 57,
        "three transactions rolled back: {naive:?}"
    );
    assert_eq!(naive.ghosts, 3, "their events went out anyway: {naive:?}");
    assert_eq!(naive.lost, 0, "{naive:?}");
    kept_everything("dual-write-rollback", &pattern);
    assert_eq!(
        pattern.placed, 57,
        "the same three rolled back: {pattern:?}"
    );
}

#[tokio::test]
async fn a_relay_marking_before_the_confirmation_loses_the_refused_batches() {
    let (naive, pattern) = ledgers("mark-before-confirm", 7).await;
    // Every order of a refused batch is lost, not only the chosen ones: at least one batch.
    assert!(naive.lost >= 3, "{naive:?}");
    assert_eq!(naive.applied + naive.lost, naive.placed, "{naive:?}");
    assert_eq!(
        naive.stuck, 0,
        "the lost rows are marked published: {naive:?}"
    );
    kept_everything("mark-before-confirm", &pattern);
    assert!(
        pattern.fault.contains("refused 1 publish"),
        "{}",
        pattern.fault
    );
}

#[tokio::test]
async fn a_new_idempotency_key_per_attempt_charges_the_customer_twice() {
    let (naive, pattern) = ledgers("key-per-attempt", 7).await;
    assert_eq!(
        naive.doubled, 3,
        "one extra charge per lost answer: {naive:?}"
    );
    assert_eq!(naive.lost, 0, "{naive:?}");
    kept_everything("key-per-attempt", &pattern);
}

#[tokio::test]
async fn publishing_from_the_request_path_loses_what_comes_in_while_the_broker_is_down() {
    let (naive, pattern) = ledgers("broker-down", 7).await;
    assert_eq!(naive.lost, 12, "every order of the outage: {naive:?}");
    assert!(
        naive.fault.contains("12 requests answered with an error"),
        "{}",
        naive.fault
    );
    kept_everything("broker-down", &pattern);
    assert!(
        pattern.fault.contains("0 requests answered with an error"),
        "{}",
        pattern.fault
    );
    // The relay met the outage too, and drained after it.
    assert!(
        !pattern.fault.contains(": 0 publishes refused"),
        "{}",
        pattern.fault
    );
}

#[tokio::test]
async fn a_compensation_deduplicated_by_message_gives_the_stock_back_twice() {
    let (naive, pattern) = ledgers("compensation-twice", 7).await;
    assert_eq!(naive.doubled, 3, "one extra release per resend: {naive:?}");
    assert_eq!(naive.lost, 0, "{naive:?}");
    kept_everything("compensation-twice", &pattern);
}

#[tokio::test]
async fn a_poison_message_retried_in_place_holds_its_partition() {
    let (naive, pattern) = ledgers("poison-in-place", 7).await;
    assert!(
        naive.stuck > 0,
        "orders behind the poison waited: {naive:?}"
    );
    assert_eq!(naive.applied + naive.stuck, naive.placed, "{naive:?}");
    assert!(naive.fault.contains("0 dead-lettered"), "{}", naive.fault);
    kept_everything("poison-in-place", &pattern);
    assert!(
        pattern.fault.contains("2 dead-lettered"),
        "{}",
        pattern.fault
    );
}

#[tokio::test]
async fn a_meaning_changed_without_a_new_version_is_read_wrong_without_an_error() {
    let (naive, pattern) = ledgers("meaning-without-version", 7).await;
    assert!(naive.wrong > 0, "{naive:?}");
    // Silently: every event read and applied once.
    assert_eq!(
        (naive.applied, naive.lost, naive.doubled, naive.stuck),
        (naive.placed, 0, 0, 0),
        "{naive:?}"
    );
    kept_everything("meaning-without-version", &pattern);
}

#[tokio::test]
async fn the_same_seed_gives_the_same_run_and_another_seed_other_kills() {
    let first = ledgers("no-deduplication", 11).await;
    let again = ledgers("no-deduplication", 11).await;
    assert_eq!(first, again);
    let other = ledgers("no-deduplication", 12).await;
    assert_ne!(first.0.fault, other.0.fault, "the kills land elsewhere");
}

#[test]
fn every_scenario_is_found_by_name_and_number_and_all_runs_them_all() {
    let all = km0::lab::scenarios();
    for s in all {
        assert_eq!(find(s.name).unwrap()[0].number, s.number);
        assert_eq!(find(&s.number.to_string()).unwrap()[0].name, s.name);
    }
    assert_eq!(find("all").unwrap().len(), all.len());
    let err = find("no-such-thing").unwrap_err().to_string();
    assert!(err.contains("km0 lab list"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_step_without_transactions_counts_a_dead_batch_twice() {
    let (naive, pattern) = ledgers("pipeline-without-transactions", 7).await;
    assert!(naive.doubled > 0, "{naive:?}");
    assert_eq!(naive.lost, 0, "{naive:?}");
    assert_eq!(naive.applied, naive.placed + naive.doubled, "{naive:?}");
    kept_everything("pipeline-without-transactions", &pattern);
    assert!(pattern.fault.contains("killed"), "{}", pattern.fault);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exercise_one_charges_the_customer_again_after_a_kill() {
    let (naive, pattern) = ledgers("auto-commit-charge", 7).await;
    assert!(
        naive.doubled >= 3,
        "at least the killed orders twice: {naive:?}"
    );
    assert_eq!(naive.lost, 0, "{naive:?}");
    kept_everything("auto-commit-charge", &pattern);
    assert!(naive.fault.contains("killed 3 times"), "{}", naive.fault);
    assert!(
        pattern.fault.contains("killed 3 times"),
        "{}",
        pattern.fault
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_consumers_on_one_queue_apply_a_cancellation_before_its_order() {
    let (naive, pattern) = ledgers("competing-consumers", 7).await;
    assert!(
        naive.out_of_order >= 3,
        "at least the three slow orders: {naive:?}"
    );
    assert_eq!((naive.lost, naive.doubled), (0, 0), "{naive:?}");
    kept_everything("competing-consumers", &pattern);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_lock_whose_ttl_expires_lets_two_workers_apply_an_order() {
    let (naive, pattern) = ledgers("lock-ttl", 7).await;
    assert_eq!(naive.doubled, 3, "one repeat per pause: {naive:?}");
    assert_eq!(naive.lost, 0, "{naive:?}");
    kept_everything("lock-ttl", &pattern);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_token_refuses_the_holder_whose_lock_expired() {
    let (naive, pattern) = ledgers("lock-fencing", 7).await;
    assert_eq!(naive.doubled, 3, "{naive:?}");
    kept_everything("lock-fencing", &pattern);
    assert!(
        pattern.fault.contains("stale token refused 3 times"),
        "{}",
        pattern.fault
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_in_place_holds_up_every_order_behind_the_failing_one() {
    let (naive, pattern) = ledgers("retry-in-place", 7).await;
    assert!(naive.held_up > 0, "{naive:?}");
    assert_eq!(
        (naive.lost, naive.doubled, naive.stuck),
        (0, 0, 0),
        "{naive:?}"
    );
    kept_everything("retry-in-place", &pattern);
    assert_eq!(pattern.held_up, 0, "{pattern:?}");
}
