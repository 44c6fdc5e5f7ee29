//! A record with `entrega-only-group` (a dead letter replayed to one group) is handled only by
//! that group's workers, provided the header is signed with the operators' replay key: every
//! other group then acknowledges it without handling it. An unsigned or forged header is
//! ignored and the record handled as any other, so nobody who can publish can make a
//! consumer skip a record. On the in-memory log and on the SQLite log.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;

use entrega::Router;
use entrega_core::headers::{ONLY_GROUP, ONLY_GROUP_SIGNATURE};
use entrega_core::ReplayKey;
use support::handlers::Scripted;
use support::worker_steps::{
    config, dead_letters, setup, wait_caught_up, Running, DLQ, GROUP, TOPIC,
};
use support::{event_message, raw_message};

fn key() -> ReplayKey {
    ReplayKey::new("worker-tests-replay-key").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_records_for_another_group_are_acknowledged_unhandled() {
    let key = key();
    for env in setup(1).await {
        let (_, plain) = event_message(TOPIC, "P-1", "pedido.creado", 0);
        let (_, mut mine) = event_message(TOPIC, "P-1", "pedido.creado", 1);
        key.stamp(&mut mine, GROUP);
        let (_, mut theirs) = event_message(TOPIC, "P-1", "pedido.creado", 2);
        key.stamp(&mut theirs, "analitica");
        // Unreadable, but not this group's to judge: no dead letter from here.
        let mut theirs_malformed = raw_message(TOPIC, "P-1", b"not json");
        key.stamp(&mut theirs_malformed, "analitica");
        let (_, last) = event_message(TOPIC, "P-1", "pedido.creado", 3);
        env.log
            .publisher()
            .publish(&[plain, mine, theirs, theirs_malformed, last])
            .await
            .unwrap();

        let handler = Arc::new(Scripted::ok());
        let mut cfg = config();
        cfg.replay_key = Some(key.clone());
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
            cfg,
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.acked(), 3, "{:?}", env.backend);
        assert_eq!(running.stats.ignored(), 2, "{:?}", env.backend);
        assert_eq!(running.stats.dead_lettered(), 0, "{:?}", env.backend);
        running.stop().await;
        assert_eq!(
            handler.applied_ns("P-1"),
            vec![0, 1, 3],
            "{:?}",
            env.backend
        );
        assert!(dead_letters(&env).await.is_empty(), "{:?}", env.backend);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_forged_or_unverifiable_headers_are_handled_as_any_record() {
    let key = key();
    let forger = ReplayKey::new("a-key-the-operators-never-had").unwrap();
    for with_key in [true, false] {
        for env in setup(1).await {
            let (_, mut unsigned) = event_message(TOPIC, "P-1", "pedido.creado", 0);
            unsigned.headers.set(ONLY_GROUP, "analitica");
            let (_, mut forged) = event_message(TOPIC, "P-1", "pedido.creado", 1);
            forger.stamp(&mut forged, "analitica");
            // A genuine signature copied from another record.
            let (_, mut genuine) = event_message(TOPIC, "P-1", "pedido.creado", 9);
            key.stamp(&mut genuine, "analitica");
            let (_, mut copied) = event_message(TOPIC, "P-1", "pedido.creado", 2);
            copied.headers.set(ONLY_GROUP, "analitica");
            copied.headers.set(
                ONLY_GROUP_SIGNATURE,
                genuine.headers.get(ONLY_GROUP_SIGNATURE).unwrap(),
            );
            // Signed, but the worker has no key to verify it with (when `with_key` is off).
            let (_, mut signed) = event_message(TOPIC, "P-1", "pedido.creado", 3);
            key.stamp(&mut signed, "analitica");
            // Malformed and unsigned: judged here, so dead-lettered here.
            let mut malformed = raw_message(TOPIC, "P-1", b"not json");
            malformed.headers.set(ONLY_GROUP, "analitica");
            env.log
                .publisher()
                .publish(&[unsigned, forged, copied, signed, malformed])
                .await
                .unwrap();

            let handler = Arc::new(Scripted::ok());
            let mut cfg = config();
            cfg.replay_key = with_key.then(|| key.clone());
            env.log.admin().ensure_topic(DLQ, 1).await.unwrap();
            let running = Running::start_with(
                env.log.as_ref(),
                env.log.publisher(),
                Router::new().route("pedido.creado", handler.clone()),
                cfg,
            );
            wait_caught_up(&env).await;
            let stats = running.stats.clone();
            running.stop().await;
            let handled = if with_key {
                vec![0, 1, 2]
            } else {
                vec![0, 1, 2, 3]
            };
            assert_eq!(
                handler.applied_ns("P-1"),
                handled,
                "{:?} key {with_key}",
                env.backend
            );
            assert_eq!(stats.ignored(), u64::from(with_key), "{:?}", env.backend);
            assert_eq!(stats.dead_lettered(), 1, "{:?}", env.backend);
            assert_eq!(dead_letters(&env).await.len(), 1, "{:?}", env.backend);
        }
    }
}
