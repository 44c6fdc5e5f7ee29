//! The typed, idempotent consumer (`entrega::Idempotent`) and producers held to their
//! contracts (`Db::with_contracts`), on SQLite and PostgreSQL: one effect per key, rolled back
//! with its key on failure, older versions upcast, unreadable versions dead-lettered with
//! class `esquema`, and an event that breaks its contract never reaching the outbox.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;

use async_trait::async_trait;
use entrega::db::{query, Backend, Db, Migration};
use entrega::{
    Apply, Catalog, ContractError, DeadClass, Event, Handler, HandlerError, Headers, Idempotent,
    Message, MigrationSet, NewEvent, StoreError, TraceContext, Tx, Upcasters,
};
use entrega_core::headers::{CLASS, CODE};
use entrega_core::Envelope;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use support::on_both_databases;
use support::pg::FreshDb;
use support::worker_steps::{dead_letters, header, setup, wait_caught_up, Running, TOPIC};
use support::TempDir;

const CONSUMER: &str = "reparto.envios";

const APP: &[Migration] = &[Migration::same(
    1,
    "envios",
    "CREATE TABLE IF NOT EXISTS envios (pedido TEXT PRIMARY KEY, ciudad TEXT NOT NULL)",
)];

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Direccion {
    ciudad: String,
    codigo_postal: String,
}

/// The consumer's version of `pedido.creado`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct PedidoCreado {
    id: String,
    cliente: String,
    direccion_entrega: Direccion,
}

impl Event for PedidoCreado {
    const TIPO: &'static str = "pedido.creado";
    const VERSION: u32 = 2;
}

/// Records the order's city; a city named `falla` fails after writing, so the transaction
/// must take the write back.
struct Ship;

#[async_trait]
impl Apply<PedidoCreado> for Ship {
    async fn apply(
        &self,
        tx: &mut Tx,
        event: PedidoCreado,
        _: &Message,
    ) -> Result<(), HandlerError> {
        let ciudad = event.direccion_entrega.ciudad;
        tx.execute(
            query("INSERT INTO envios (pedido, ciudad) VALUES ($1, $2)")
                .bind(&event.id)
                .bind(&ciudad),
        )
        .await?;
        if ciudad == "falla" {
            return Err(HandlerError::transient("the maps service answered 503"));
        }
        Ok(())
    }
}

/// v1 had no address: it is delivered to the customer's market.
fn upcasters() -> Upcasters {
    Upcasters::new().step("pedido.creado", 1, |mut datos| {
        let mercado = datos
            .get("mercado")
            .and_then(Value::as_str)
            .ok_or("a version 1 order without `mercado` has no address to deliver to")?
            .to_owned();
        datos["direccion_entrega"] = json!({"ciudad": mercado, "codigo_postal": ""});
        Ok(datos)
    })
}

fn message(id: &str, version: u32, datos: Value) -> Message {
    let mut envelope = Envelope::new("pedido.creado", "pedidos", datos);
    envelope.version = version;
    Message {
        envelope,
        topic: TOPIC.to_owned(),
        partition: 0,
        offset: 0,
        key: Some(id.to_owned()),
        headers: Headers::new(),
        attempt: 1,
        trace: TraceContext::root(),
    }
}

fn v2(id: &str, ciudad: &str) -> Value {
    json!({"id": id, "cliente": "ana", "direccion_entrega": {"ciudad": ciudad, "codigo_postal": "17001"}})
}

async fn consumer_db(backend: Backend, dir: &TempDir) -> FreshDb {
    let fresh = FreshDb::new(backend, dir, "reparto.db").await;
    fresh
        .db
        .migrate(&[MigrationSet::Inbox, MigrationSet::Outbox])
        .await
        .unwrap();
    fresh.db.apply_migrations("reparto", APP).await.unwrap();
    fresh
}

async fn shipped(db: &Db) -> Vec<(String, String)> {
    db.fetch_all(query("SELECT pedido, ciudad FROM envios ORDER BY pedido"))
        .await
        .unwrap()
}

async fn typed_handler_applies_once_rolls_back_and_upcasts(backend: Backend) {
    let dir = TempDir::new();
    let fresh = consumer_db(backend, &dir).await;
    let db = fresh.db.clone();
    let consumer = Idempotent::new(db.clone(), CONSUMER)
        .upcasters(upcasters())
        .on(Ship);
    let stats = consumer.stats();

    let first = message("P-1", 2, v2("P-1", "Girona"));
    consumer.handle(&first).await.unwrap();
    // Delivered again (the broker's at-least-once): acknowledged, nothing applied twice.
    consumer.handle(&first).await.unwrap();
    assert_eq!(shipped(&db).await, [("P-1".into(), "Girona".into())]);
    assert_eq!((stats.applied(), stats.duplicates()), (1, 1));

    // The handler fails after its write: the write and the key go back together.
    let failing = message("P-2", 2, v2("P-2", "falla"));
    let error = consumer.handle(&failing).await.unwrap_err();
    assert!(error.is_transient());
    assert_eq!(shipped(&db).await.len(), 1);
    assert_eq!(
        db.processed(CONSUMER).await.unwrap(),
        1,
        "the key was rolled back"
    );

    // Version 1 reaches the version 2 handler through the upcaster.
    let old = message(
        "P-3",
        1,
        json!({"id": "P-3", "cliente": "ana", "mercado": "Reus"}),
    );
    consumer.handle(&old).await.unwrap();
    assert_eq!(shipped(&db).await[1], ("P-3".into(), "Reus".into()));

    // A newer version, a refused upcast and datos that do not fit: esquema, nothing claimed.
    let cases = [
        (message("P-4", 3, v2("P-4", "Girona")), "newer_version"),
        (
            message("P-5", 1, json!({"id": "P-5", "cliente": "ana"})),
            "upcast_failed",
        ),
        (
            message(
                "P-6",
                2,
                json!({"id": "P-6", "cliente": 7, "direccion_entrega": {}}),
            ),
            "invalid_data",
        ),
    ];
    for (msg, code) in cases {
        let error = consumer.handle(&msg).await.unwrap_err();
        assert_eq!(error.dead_class(), DeadClass::Schema, "{error}");
        assert_eq!(error.code(), Some(code), "{error}");
    }
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 2);
    assert_eq!(shipped(&db).await.len(), 2);
    fresh.finish().await;
}

async fn producers_are_held_to_their_contracts(backend: Backend) {
    let dir = TempDir::new();
    let fresh = consumer_db(backend, &dir).await;
    let catalog = Arc::new(Catalog::new().event::<PedidoCreado>(TOPIC, "An order was placed."));
    let db = fresh.db.clone().with_contracts(catalog);
    let good = PedidoCreado {
        id: "P-1".into(),
        cliente: "ana".into(),
        direccion_entrega: Direccion {
            ciudad: "Girona".into(),
            codigo_postal: "17001".into(),
        },
    };

    let mut tx = db.begin().await.unwrap();
    tx.publish("pedido", "P-1", &good).await.unwrap();
    // Written by hand without the address: refused, in the caller's open transaction.
    let mut bad = NewEvent::new(
        "pedido",
        "P-2",
        "pedido.creado",
        json!({"id": "P-2", "cliente": "ana"}),
    );
    bad.version = 2;
    match tx.enqueue(&bad).await {
        Err(StoreError::Contract(ContractError::Invalid { field, .. })) => {
            assert_eq!(field, "direccion_entrega");
        }
        other => panic!("expected a contract error, got {other:?}"),
    }
    // A version with no contract: refused too.
    bad.version = 9;
    assert!(matches!(
        tx.enqueue_all(&[good.outgoing("pedido", "P-3").unwrap(), bad.clone()])
            .await,
        Err(StoreError::Contract(ContractError::Unregistered {
            version: 9,
            ..
        }))
    ));
    tx.commit().await.unwrap();
    let rows: Vec<(String, i32)> = db
        .fetch_all(query(
            "SELECT agregado_id, version FROM outbox ORDER BY agregado_id",
        ))
        .await
        .unwrap();
    assert_eq!(
        rows,
        [("P-1".to_owned(), 2)],
        "only the event that meets its contract"
    );
    fresh.finish().await;
}

on_both_databases!(
    typed_handler_applies_once_rolls_back_and_upcasts,
    producers_are_held_to_their_contracts
);

/// Exercise 3.3 of the seed in small: a version 1 event reaches a consumer that reads only
/// version 2; it is dead-lettered at once with class `esquema` and a code naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_consumer_cannot_read_is_an_esquema_dead_letter() {
    let dir = TempDir::new();
    let fresh = consumer_db(Backend::Sqlite, &dir).await;
    for env in setup(1).await {
        let mut envelope = Envelope::new(
            "pedido.creado",
            "pedidos",
            json!({"id": "P-1", "cliente": "ana"}),
        );
        envelope.version = 1;
        let record = entrega::OutgoingMessage {
            topic: TOPIC.to_owned(),
            key: Some("P-1".to_owned()),
            headers: Headers::new().with("tipo", "pedido.creado"),
            payload: envelope.to_bytes(),
        };
        env.log.publisher().publish(&[record]).await.unwrap();
        // No upcaster: version 2 only.
        let router = Idempotent::new(fresh.db.clone(), CONSUMER)
            .on(Ship)
            .router();
        let running = Running::start(env.log.as_ref(), env.log.publisher(), router);
        wait_caught_up(&env).await;
        assert_eq!(running.stats.dead_lettered(), 1);
        running.stop().await;
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1, "{:?}", env.backend);
        assert_eq!(header(&dlq[0], CLASS), "esquema");
        assert_eq!(header(&dlq[0], CODE), "no_upcaster");
        assert_eq!(header(&dlq[0], "intentos"), "1", "never retried");
        assert!(
            header(&dlq[0], "motivo").contains("version 1"),
            "{}",
            header(&dlq[0], "motivo")
        );
    }
    assert!(shipped(&fresh.db).await.is_empty());
    fresh.finish().await;
}
