//! The order saga against the races the second seed warns about, on the embedded default,
//! PostgreSQL, PostgreSQL + RabbitMQ and PostgreSQL + Kafka, with every service in one
//! process and the gateway simulator slowed down: a customer's cancel
//! while the charge is at the gateway, and a charge that answers after its step's deadline.
//! Either way the order ends cancelled once, with its stock back and a net charge of zero:
//! never both paid and cancelled, and the late answer changes nothing.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use entrega::saga::{EventKind, Phase, SagaRecord, SagaStatus};
use entrega::Backoff;
use km0::services::pasarela::Faults;
use km0::services::pedidos::{OrderState, SagaTimings};
use km0::wiring::{Components, Running, System};
use serde_json::json;

/// Where a scenario runs; holds the test's own broker (vhost or Kafka node) while it does.
enum Setup {
    Sqlite,
    Postgres,
    PostgresRabbitmq(common::amqp::Vhost),
    PostgresKafka(common::kafka_ns::KafkaNamespace),
}

impl Setup {
    fn system(&self) -> System {
        let on_postgres = |broker: String| {
            let databases = common::test_system("postgres").databases().clone();
            System::new(databases, broker).with_lease_ttl(Duration::from_secs(2))
        };
        match self {
            Self::Sqlite => common::test_system("sqlite"),
            Self::Postgres => common::test_system("postgres"),
            Self::PostgresRabbitmq(vhost) => on_postgres(format!("{}?shards=4", vhost.url())),
            Self::PostgresKafka(kafka) => on_postgres(kafka.url_with("session_timeout_ms=6000")),
        }
    }
}

struct Run {
    _setup: Setup,
    system: System,
    gateway: Running,
    services: Running,
    http: reqwest::Client,
    base: String,
}

async fn start(setup: Setup, latency_ms: u64, step_deadline: Duration) -> Run {
    let timings = SagaTimings {
        step_deadline,
        delivery_deadline: Duration::from_secs(20),
        resend: Backoff::new(Duration::from_millis(500), Duration::from_secs(2)),
        compensation_attempts: 20,
    };
    let system = setup.system().with_saga(timings);
    let mut gateway = Components::none("pasarela-races");
    gateway.add(&km0::services::pasarela::COMPONENT);
    gateway.faults = Faults {
        latency_ms,
        ..Faults::default()
    };
    let gateway = system
        .start(gateway, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut services = Components::all("races");
    services.add(&km0::services::pagos::COMPONENT);
    services.add(&km0::services::reparto::COMPONENT);
    services.pasarela_url = Some(format!("http://{}", gateway.http_addr().unwrap()));
    let services = system
        .start(services, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = format!("http://{}", services.http_addr().unwrap());
    Run {
        _setup: setup,
        system,
        gateway,
        services,
        http: reqwest::Client::new(),
        base,
    }
}

impl Run {
    async fn place(&self, id: &str) {
        let body = json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
            "lineas": [{"producto": "calabacin", "cantidad": 4, "precio_centimos": 300}],
            "direccion_entrega": {"ciudad": "Madrid", "codigo_postal": "28013", "calle": "Gran Vía 1"}});
        let status = self
            .http
            .post(format!("{}/pedidos", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 201);
    }

    /// Waits (at most 60 s, else fails with `what`) until the saga of `id` satisfies `done`.
    async fn wait_for(&self, id: &str, what: &str, done: impl Fn(&SagaRecord) -> bool) {
        let pedidos = self.system.pedidos().await.unwrap();
        let sagas = self.system.sagas(&pedidos).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&sagas.show(id).await.unwrap().unwrap().0) {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pedidos.db().close().await;
    }

    /// Waits until the saga of `id` is final, then for the gateway to be idle, and checks
    /// that the order ended cancelled once with nothing kept.
    async fn assert_cancelled_with_nothing_kept(self, id: &str) {
        let pedidos = self.system.pedidos().await.unwrap();
        let sagas = self.system.sagas(&pedidos).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let (saga, history) = loop {
            let (saga, history) = sagas.show(id).await.unwrap().unwrap();
            if saga.status.is_final() {
                break (saga, history);
            }
            assert!(
                Instant::now() < deadline,
                "saga still {:?}: {history:#?}",
                saga.status
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // The charge in flight answers meanwhile; let it land before reading the ledger.
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.services.stop().await.unwrap();
        assert_eq!(saga.status, SagaStatus::Compensated, "{history:#?}");
        let refunds = history
            .iter()
            .filter(|e| e.what == EventKind::Replied && e.phase == Phase::Compensation)
            .count();
        assert_eq!(
            refunds, 2,
            "refund and release applied once each: {history:#?}"
        );
        let order = pedidos.find(id).await.unwrap().unwrap();
        assert_eq!(order.state, OrderState::Cancelled);
        let ledger = self.system.pasarela().await.unwrap();
        assert_eq!(ledger.net_for(id).await.unwrap(), 0, "nothing kept");
        let stock = self.system.inventario().await.unwrap();
        assert_eq!(
            stock.units("calabacin").await.unwrap(),
            Some(80),
            "stock back"
        );
        self.gateway.stop().await.unwrap();
        for db in [pedidos.db(), ledger.db(), stock.db()] {
            db.close().await;
        }
        self.system.destroy().await.unwrap();
    }
}

async fn a_cancel_while_the_charge_is_at_the_gateway(setup: Setup) {
    let run = start(setup, 1_500, Duration::from_secs(20)).await;
    run.place("R-1").await;
    // Cancel once the charge has been asked for: it is at the gateway for 1.5 s.
    run.wait_for("R-1", "the charge was never asked for", |saga| {
        saga.step >= 1
    })
    .await;
    let cancel = run
        .http
        .post(format!("{}/pedidos/R-1/cancelacion", run.base))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status().as_u16(), 202);
    run.wait_for("R-1", "the cancel never finished", |saga| {
        saga.status == SagaStatus::Compensated
    })
    .await;
    // Asked again once it is over: the final state, not another "cancelling".
    let again = run
        .http
        .post(format!("{}/pedidos/R-1/cancelacion", run.base))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 200);
    let body: serde_json::Value = again.json().await.unwrap();
    assert_eq!(body["estado"], "cancelado");
    run.assert_cancelled_with_nothing_kept("R-1").await;
}

async fn a_charge_answering_after_its_deadline(setup: Setup) {
    // The gateway takes 3 s; the step may take 1 s.
    let run = start(setup, 3_000, Duration::from_secs(1)).await;
    // A warm-up order first: the measured reservation must beat its 1 s deadline, which a
    // consumer group still forming (Kafka, a loaded machine) would not. Once the warm-up has
    // moved past its reservation, or given up on it, the groups are up.
    run.place("R-0").await;
    run.wait_for("R-0", "the warm-up never moved", |warm| {
        warm.step >= 1 || warm.status != SagaStatus::Running
    })
    .await;
    run.place("R-2").await;
    run.assert_cancelled_with_nothing_kept("R-2").await;
}

macro_rules! on_every_setup {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Setup::Sqlite).await;
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Setup::Postgres).await;
            })*
        }
        mod postgres_rabbitmq {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let vhost = super::common::amqp::Vhost::create();
                super::$scenario(super::Setup::PostgresRabbitmq(vhost)).await;
            })*
        }
        mod postgres_kafka {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let kafka = super::common::kafka_ns::KafkaNamespace::new();
                super::$scenario(super::Setup::PostgresKafka(kafka)).await;
            })*
        }
    };
}

on_every_setup!(
    a_cancel_while_the_charge_is_at_the_gateway,
    a_charge_answering_after_its_deadline,
);
