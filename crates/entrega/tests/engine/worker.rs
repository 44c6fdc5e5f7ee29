//! Worker outcomes on the in-memory log and on the SQLite log: ack, dead letters with their
//! headers, retry in place, malformed and unknown messages, ignored types.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;

use entrega::Router;
use entrega_core::headers::{
    CLASS, CODE, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC,
};
use support::handlers::{Scripted, Step};
use support::worker_steps::{
    dead_letters, header, publish, setup, wait_caught_up, Running, GROUP, TOPIC,
};
use support::{event_message, raw_message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_commits_offsets() {
    for env in setup(2).await {
        publish(&env, "P-1", "pedido.creado", 0..3).await;
        publish(&env, "P-2", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::ok());
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        assert_eq!(running.stats.acked(), 6, "{:?}", env.backend);
        running.stop().await;
        assert_eq!(handler.applied_ns("P-1"), vec![0, 1, 2]);
        assert_eq!(handler.applied_ns("P-2"), vec![0, 1, 2]);
        assert!(dead_letters(&env).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_goes_to_the_dlq_and_the_offset_advances() {
    for env in setup(1).await {
        let (poison, message) = event_message(TOPIC, "P-1", "pedido.creado", 1);
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        env.log
            .publisher()
            .publish(std::slice::from_ref(&message))
            .await
            .unwrap();
        publish(&env, "P-1", "pedido.creado", 2..3).await;
        let handler = Arc::new(Scripted::new(move |m| {
            if m.envelope.id == poison.id {
                Step::Permanent
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
        assert_eq!(running.stats.dead_lettered(), 1);
        running.stop().await;
        assert_eq!(handler.applied_ns("P-1"), vec![0, 2], "{:?}", env.backend);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        let dead = &dlq[0];
        assert_eq!(
            dead.payload, message.payload,
            "the original payload is kept"
        );
        assert_eq!(dead.key.as_deref(), Some("P-1"));
        assert_eq!(header(dead, "motivo"), "permanent: stock insuficiente");
        assert_eq!(header(dead, CLASS), "rechazado");
        assert_eq!(header(dead, CODE), "sin_stock", "the handler's code");
        assert_eq!(header(dead, "intentos"), "1");
        assert_eq!(header(dead, "tipo"), "pedido.creado");
        assert_eq!(header(dead, "id_evento"), poison.id.to_string());
        assert_eq!(header(dead, ORIGIN_TOPIC), TOPIC);
        assert_eq!(header(dead, ORIGIN_PARTITION), "0");
        assert_eq!(header(dead, ORIGIN_OFFSET), "1");
        assert_eq!(header(dead, ORIGIN_GROUP), GROUP);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_then_success_is_applied_once_in_order() {
    for env in setup(1).await {
        let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 1 && m.attempt < 3 {
                Step::Transient
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
        assert_eq!(running.stats.retried(), 2);
        running.stop().await;
        assert_eq!(
            handler.attempts_of(&ids[1]),
            vec![1, 2, 3],
            "{:?}",
            env.backend
        );
        assert_eq!(
            handler.attempts_of(&ids[2]).len(),
            1,
            "a later message overtook or repeated"
        );
        assert_eq!(handler.applied_ns("P-1"), vec![0, 1, 2]);
        assert!(dead_letters(&env).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_forever_is_dead_lettered_after_max_attempts() {
    for env in setup(1).await {
        let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.envelope.data["n"] == 1 {
                Step::Transient
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
        running.stop().await;
        assert_eq!(
            handler.attempts_of(&ids[1]),
            vec![1, 2, 3],
            "{:?}",
            env.backend
        );
        assert_eq!(handler.applied_ns("P-1"), vec![0, 2]);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(header(&dlq[0], "intentos"), "3");
        assert_eq!(header(&dlq[0], CLASS), "agotado");
        assert_eq!(dlq[0].headers.get(CODE), None);
        assert_eq!(
            header(&dlq[0], "motivo"),
            "transient exhausted after 3 attempts: inventario db restarting"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payloads_go_to_the_dlq() {
    for env in setup(1).await {
        let bad = [
            raw_message(TOPIC, "P-1", b"no es json"),
            raw_message(
                TOPIC,
                "P-1",
                br#"{"tipo":"pedido.creado","version":1,"fecha_ms":1,"origen":"x","datos":{}}"#,
            ),
        ];
        env.log.publisher().publish(&bad).await.unwrap();
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        let handler = Arc::new(Scripted::ok());
        let running = Running::start(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
        );
        wait_caught_up(&env).await;
        running.stop().await;
        assert_eq!(handler.applied_ns("P-1"), vec![0], "{:?}", env.backend);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 2);
        assert!(
            header(&dlq[0], "motivo").starts_with("malformed json at line 1"),
            "{}",
            header(&dlq[0], "motivo")
        );
        assert_eq!(dlq[0].payload, b"no es json");
        assert_eq!(header(&dlq[1], "motivo"), "missing field `id_evento`");
        for dead in &dlq {
            assert_eq!(header(dead, CLASS), "ilegible");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tipo_goes_to_the_dlq_and_ignored_tipo_is_acked() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.desconocido", 0..1).await;
        publish(&env, "P-1", "pedido.visto", 1..2).await;
        publish(&env, "P-1", "pedido.creado", 2..3).await;
        let handler = Arc::new(Scripted::ok());
        let router = Router::new()
            .route("pedido.creado", handler.clone())
            .ignore("pedido.visto");
        let running = Running::start(env.log.as_ref(), env.log.publisher(), router);
        wait_caught_up(&env).await;
        assert_eq!(running.stats.ignored(), 1);
        assert_eq!(running.stats.acked(), 1);
        running.stop().await;
        assert_eq!(
            handler.calls(),
            1,
            "{:?}: only the routed type reaches the handler",
            env.backend
        );
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(
            header(&dlq[0], "motivo"),
            "unknown tipo `pedido.desconocido`"
        );
        assert_eq!(header(&dlq[0], CLASS), "tipo_desconocido");
    }
}
