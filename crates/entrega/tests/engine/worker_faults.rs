//! Worker faults: panicking handlers, short batch results, a failing dead-letter publish,
//! and shutdown with a batch in flight.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;

use entrega::{Handler, Message, Router};
use entrega_core::HandlerError;
use entrega_testkit::{wait_until, Fault, FlakyPublisher};
use support::handlers::{Scripted, Step};
use support::worker_steps::{
    dead_letters, publish, setup, wait_caught_up, Running, GROUP, PATIENCE, TOPIC,
};
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried() {
    for env in setup(1).await {
        let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 1 && m.attempt == 1 {
                Step::Panic
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.retried(), 1);
        running.stop().await;
        // The batch panicked, so the same attempt ran again alone to find the culprit; that
        // one panicked too and was retried as attempt 2.
        assert_eq!(
            handler.attempts_of(&ids[1]),
            vec![1, 1, 2],
            "{:?}",
            env.backend
        );
        assert_eq!(handler.applied_ns("P-1"), vec![0, 1, 2]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_batch_result_redelivers_the_rest_in_order() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..5).await;
        let handler = Arc::new(Scripted::ok().with_batch_cap(2));
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(
            handler.applied_ns("P-1"),
            vec![0, 1, 2, 3, 4],
            "{:?}",
            env.backend
        );
        assert_eq!(
            handler.calls(),
            5,
            "a message was attempted twice: {:?}",
            handler.batches()
        );
        assert!(handler.batches().len() >= 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_waits_for_the_dead_letter_publish() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..2).await;
        let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
        flaky.set(Fault::Unavailable);
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 0 {
                Step::Permanent
            } else {
                Step::Ok
            }
        }));
        let running = Running::start(
            env.log.as_ref(),
            flaky.clone(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        let stats = running.stats.clone();
        assert!(wait_until(PATIENCE, || async { stats.retried() >= 2 }).await);
        assert!(
            env.log
                .committed(GROUP, TOPIC)
                .await
                .unwrap()
                .iter()
                .all(|(_, o)| *o == 0),
            "{:?}",
            env.backend
        );
        flaky.recover();
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(dead_letters(&env).await.len(), 1);
        assert_eq!(handler.applied_ns("P-1"), vec![1]);
    }
}

/// Holds its first batch until released, to shut the worker down while it is in flight.
struct Gate {
    started: Notify,
    release: Notify,
    inner: Scripted,
}

#[async_trait::async_trait]
impl Handler for Gate {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        self.inner.handle(msg).await
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        self.started.notify_one();
        self.release.notified().await;
        self.inner.handle_batch(msgs).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_and_commits_the_batch_in_flight() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..5).await;
        let gate = Arc::new(Gate {
            started: Notify::new(),
            release: Notify::new(),
            inner: Scripted::ok(),
        });
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", gate.clone()),
        );
        tokio::time::timeout(PATIENCE, gate.started.notified())
            .await
            .expect("batch started");
        running.token.cancel();
        gate.release.notify_one();
        running.handle.await.unwrap().unwrap();
        assert_eq!(
            gate.inner.applied_ns("P-1"),
            vec![0, 1, 2, 3, 4],
            "{:?}",
            env.backend
        );
        assert_eq!(env.log.committed(GROUP, TOPIC).await.unwrap(), vec![(0, 5)]);
    }
}

/// Hangs on the first attempt of message `n == 1`, applies everything else at once.
struct HangsOnce {
    applied: std::sync::Mutex<Vec<(u64, u32)>>,
}

#[async_trait::async_trait]
impl Handler for HangsOnce {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let n = msg.envelope.data["n"].as_u64().unwrap();
        if n == 1 && msg.attempt == 1 {
            std::future::pending::<()>().await;
        }
        self.applied.lock().unwrap().push((n, msg.attempt));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_counts_as_a_transient_failure() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(HangsOnce {
            applied: Default::default(),
        });
        let mut config = support::worker_steps::config();
        config.handler_timeout = Some(std::time::Duration::from_millis(200));
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
            config,
        );
        wait_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;
        // The batch timed out, ran again one by one; message 1 timed out once more on its
        // own (attempt 1), then succeeded on attempt 2, in order.
        let applied = handler.applied.lock().unwrap().clone();
        let ns: Vec<u64> = applied.iter().map(|(n, _)| *n).collect();
        assert!(ns.ends_with(&[1, 2]), "{:?}: {applied:?}", env.backend);
        assert!(applied.contains(&(1, 2)), "{applied:?}");
        assert_eq!(stats.retried(), 1, "{:?}", env.backend);
        assert!(dead_letters(&env).await.is_empty());
    }
}

/// Refuses the first `refusals` joins as a database whose session was just ended does, then
/// joins through `inner`.
struct RefusesJoins {
    inner: Arc<dyn entrega_core::Subscriber>,
    refusals: std::sync::atomic::AtomicU32,
    transient: bool,
}

#[async_trait::async_trait]
impl entrega_core::Subscriber for RefusesJoins {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn entrega_core::Subscription>, entrega_core::TransportError> {
        use std::sync::atomic::Ordering::SeqCst;
        let left = self.refusals.load(SeqCst);
        if left > 0 {
            self.refusals.store(left - 1, SeqCst);
            let refused =
                std::io::Error::other("terminating connection due to administrator command");
            return Err(if self.transient {
                entrega_core::TransportError::unavailable(refused)
            } else {
                entrega_core::TransportError::Rejected {
                    reason: refused.to_string(),
                }
            });
        }
        self.inner.subscribe(group, topic, member).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_refused_for_a_while_is_retried_and_a_permanent_refusal_stops_the_worker() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::ok());
        let router = || Router::new().route("pedido.creado", handler.clone());
        // Transient: the worker keeps trying and then consumes everything.
        let refusing = Arc::new(RefusesJoins {
            inner: env.log.subscriber(),
            refusals: 3.into(),
            transient: true,
        });
        let worker = entrega::Worker::new(
            refusing.clone(),
            env.log.publisher(),
            router(),
            support::worker_steps::config(),
        );
        let token = entrega::CancellationToken::new();
        let run = tokio::spawn({
            let token = token.clone();
            async move { worker.run(token).await }
        });
        wait_caught_up(&env).await;
        assert_eq!(
            refusing.refusals.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "{:?}",
            env.backend
        );
        assert_eq!(
            handler.applied_ns("P-1"),
            vec![0, 1, 2],
            "{:?}",
            env.backend
        );
        token.cancel();
        run.await.expect("worker task").expect("worker run");

        // Permanent: the worker stops with the error rather than spinning.
        let refusing = Arc::new(RefusesJoins {
            inner: env.log.subscriber(),
            refusals: 1.into(),
            transient: false,
        });
        let worker = entrega::Worker::new(
            refusing,
            env.log.publisher(),
            router(),
            support::worker_steps::config(),
        );
        let outcome = tokio::time::timeout(PATIENCE, worker.run(entrega::CancellationToken::new()))
            .await
            .expect("a permanent refusal ends the run");
        assert!(
            matches!(outcome, Err(entrega::WorkerError::Transport(ref e)) if !e.is_transient()),
            "{outcome:?}"
        );
    }
}
