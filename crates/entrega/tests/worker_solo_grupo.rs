//! A record with `entrega-solo-grupo` (a dead letter replayed to one group) is handled only by
//! that group's workers; every other group acknowledges it without handling it, on the
//! in-memory log and on the SQLite log.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;

use entrega::Router;
use entrega_core::headers::SOLO_GRUPO;
use support::handlers::Scripted;
use support::worker_steps::{dead_letters, setup, wait_caught_up, Running, GROUP, TOPIC};
use support::{event_message, raw_message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_for_another_group_are_acknowledged_unhandled() {
    for env in setup(1).await {
        let (_, plain) = event_message(TOPIC, "P-1", "pedido.creado", 0);
        let (_, mut mine) = event_message(TOPIC, "P-1", "pedido.creado", 1);
        mine.headers.set(SOLO_GRUPO, GROUP);
        let (_, mut theirs) = event_message(TOPIC, "P-1", "pedido.creado", 2);
        theirs.headers.set(SOLO_GRUPO, "analitica");
        // Unreadable, but not this group's to judge: no dead letter from here.
        let mut theirs_malformed = raw_message(TOPIC, "P-1", b"not json");
        theirs_malformed.headers.set(SOLO_GRUPO, "analitica");
        let (_, last) = event_message(TOPIC, "P-1", "pedido.creado", 3);
        env.log
            .publisher()
            .publish(&[plain, mine, theirs, theirs_malformed, last])
            .await
            .unwrap();

        let handler = Arc::new(Scripted::ok());
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
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
