//! The saga engine on both backends: a saga's row, history, commands (outbox) and the inbox
//! key of the reply that moved it commit together; replies repeated, late or foreign change
//! nothing; timers resend, reach deadlines and hand a failing compensation to an operator;
//! a cancel gives one outcome.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{query, query_each, Backend, Db, Migration, Tx};
use entrega::saga::{
    CancelOutcome, Ending, EventKind, FlowError, Phase, Reply, ReplyOutcome, SagaError, SagaFlow,
    SagaRecord, SagaStatus, Sagas, Started, StepOutcome, StepSpec,
};
use entrega::Backoff;
use entrega_core::{Envelope, ManualClock, MigrationSet, NewEvent, StoreError};
use serde_json::{json, Value};

use support::pg::FreshDb;
use support::TempDir;

const T0: i64 = 1_700_000_000_000;

const APP: &[Migration] = &[Migration::same(
    1,
    "finales",
    "CREATE TABLE IF NOT EXISTS finales (pedido TEXT PRIMARY KEY, resultado TEXT NOT NULL)",
)];

/// Reserve, charge, ship: commands `<step>.pedir` / `<step>.deshacer` on aggregate `orden`;
/// replies `<step>.hecho`, `<step>.fallido` (`transitorio` says which kind), `<step>.deshecho`.
pub(super) struct OrderFlow {
    steps: Vec<StepSpec>,
    pub(super) fail_finish: AtomicBool,
}

impl OrderFlow {
    fn new() -> Self {
        let exact = Backoff::new(Duration::from_secs(1), Duration::from_secs(4)).with_jitter(0.0);
        let step = |name| {
            StepSpec::new(name, name)
                .resend(exact)
                .deadline(Duration::from_secs(10))
                .compensation_attempts(2)
        };
        Self {
            steps: vec![
                step("reserva").compensated_by("liberacion"),
                step("cobro").compensated_by("reembolso"),
                step("envio"),
            ],
            fail_finish: AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl SagaFlow for OrderFlow {
    fn kind(&self) -> &str {
        "orden"
    }

    fn steps(&self) -> &[StepSpec] {
        &self.steps
    }

    fn command(&self, saga: &SagaRecord, step: usize, key: &str) -> Result<NewEvent, FlowError> {
        let name = self.steps[step].name;
        let importe = saga.input["importe"]
            .as_i64()
            .ok_or_else(|| FlowError::new("no importe"))?;
        let payload = json!({"pedido": saga.id, "clave": key, "importe": importe});
        Ok(NewEvent::new(
            "orden",
            &saga.id,
            format!("{name}.pedir"),
            payload,
        ))
    }

    fn compensation(
        &self,
        saga: &SagaRecord,
        step: usize,
        key: &str,
    ) -> Result<NewEvent, FlowError> {
        let name = self.steps[step].name;
        let payload = json!({"pedido": saga.id, "clave": key});
        Ok(NewEvent::new(
            "orden",
            &saga.id,
            format!("{name}.deshacer"),
            payload,
        ))
    }

    fn reply(&self, envelope: &Envelope) -> Result<Option<Reply>, FlowError> {
        let Some((step, what)) = envelope.kind.split_once('.') else {
            return Ok(None);
        };
        let field = |name: &str| {
            envelope.data[name]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| FlowError::new(format!("`{}` has no `{name}`", envelope.kind)))
        };
        let (phase, outcome) = match what {
            "hecho" => (Phase::Action, StepOutcome::Done(envelope.data.clone())),
            "deshecho" => (Phase::Compensation, StepOutcome::Done(Value::Null)),
            "fallido" | "no_deshecho" => (
                if what == "fallido" {
                    Phase::Action
                } else {
                    Phase::Compensation
                },
                StepOutcome::Failed {
                    reason: field("motivo")?,
                    transient: envelope.data["transitorio"].as_bool().unwrap_or(false),
                },
            ),
            _ => return Ok(None),
        };
        Ok(Some(Reply {
            saga_id: field("pedido")?,
            step: step.to_owned(),
            phase,
            key: field("clave")?,
            outcome,
        }))
    }

    async fn finished(
        &self,
        tx: &mut Tx,
        saga: &SagaRecord,
        ending: &Ending,
    ) -> Result<(), StoreError> {
        if self.fail_finish.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("finish failed on purpose"));
        }
        let resultado = match ending {
            Ending::Completed => "pagado".to_owned(),
            Ending::Compensated { reason } => format!("cancelado: {reason}"),
        };
        tx.execute(
            query("INSERT INTO finales (pedido, resultado) VALUES ($1, $2)")
                .bind(saga.id.as_str())
                .bind(resultado),
        )
        .await?;
        Ok(())
    }
}

pub(super) struct Fixture {
    fresh: FreshDb,
    pub(super) sagas: Sagas,
    pub(super) flow: Arc<OrderFlow>,
    clock: ManualClock,
    _dir: TempDir,
}

impl Fixture {
    pub(super) async fn new(backend: Backend) -> Self {
        let dir = TempDir::new();
        let fresh = FreshDb::new(backend, &dir, "orquestador.db").await;
        fresh
            .db
            .migrate(&[
                MigrationSet::Outbox,
                MigrationSet::Inbox,
                MigrationSet::Rpc,
                MigrationSet::Sagas,
            ])
            .await
            .unwrap();
        fresh.db.apply_migrations("app", APP).await.unwrap();
        let clock = ManualClock::new(T0);
        let flow = Arc::new(OrderFlow::new());
        let sagas = Sagas::new(fresh.db.clone(), flow.clone(), Arc::new(clock.clone()));
        Self {
            fresh,
            sagas,
            flow,
            clock,
            _dir: dir,
        }
    }

    pub(super) fn db(&self) -> &Db {
        &self.fresh.db
    }

    pub(super) async fn start(&self, id: &str) -> Started {
        let mut tx = self.db().begin().await.unwrap();
        let started = self
            .sagas
            .start_in(&mut tx, id, json!({"importe": 1250}))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        started
    }

    /// Commands in the outbox, oldest first: `(tipo, clave)`.
    pub(super) async fn commands(&self) -> Vec<(String, String)> {
        let rows: Vec<(String, String)> = self
            .db()
            .fetch_all(query_each(
                "SELECT tipo, carga FROM outbox",
                "SELECT tipo, carga::text FROM outbox",
            ))
            .await
            .unwrap();
        let mut out: Vec<(String, String)> = rows
            .into_iter()
            .map(|(kind, payload)| {
                let v: Value = serde_json::from_str(&payload).unwrap();
                (kind, v["clave"].as_str().unwrap().to_owned())
            })
            .collect();
        out.sort();
        out
    }

    pub(super) async fn count(&self, sql: &'static str) -> i64 {
        self.db().scalar(query(sql)).await.unwrap().unwrap()
    }

    pub(super) async fn saga(&self, id: &str) -> SagaRecord {
        self.sagas.show(id).await.unwrap().expect("saga").0
    }

    pub(super) async fn finish(self) {
        self.fresh.finish().await;
    }
}

pub(super) fn event(kind: &str, data: Value) -> Envelope {
    Envelope::new(kind, "servicio", data)
}

pub(super) fn done(step: &str, id: &str) -> Envelope {
    event(
        &format!("{step}.hecho"),
        json!({"pedido": id, "clave": format!("{step}-{id}")}),
    )
}

fn undone(step: &str, prefix: &str, id: &str) -> Envelope {
    event(
        &format!("{step}.deshecho"),
        json!({"pedido": id, "clave": format!("{prefix}-{id}")}),
    )
}

fn failed(step: &str, id: &str, transient: bool) -> Envelope {
    let data = json!({"pedido": id, "clave": format!("{step}-{id}"), "motivo": "no", "transitorio": transient});
    event(&format!("{step}.fallido"), data)
}

fn keyed(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = list
        .iter()
        .map(|(k, c)| ((*k).to_owned(), (*c).to_owned()))
        .collect();
    v.sort();
    v
}

async fn start_writes_row_history_and_first_command_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    assert_eq!(f.start("P1").await, Started::New);
    assert_eq!(f.start("P1").await, Started::Existing);
    assert_eq!(
        f.commands().await,
        keyed(&[("reserva.pedir", "reserva-P1")])
    );
    let (saga, history) = f.sagas.show("P1").await.unwrap().unwrap();
    assert_eq!(saga.status, SagaStatus::Running);
    assert_eq!(saga.version, 0);
    assert_eq!(saga.next_at_ms, Some(T0 + 1_000));
    let what: Vec<EventKind> = history.iter().map(|e| e.what).collect();
    assert_eq!(what, [EventKind::Started, EventKind::Sent]);
    assert_eq!(history[1].key.as_deref(), Some("reserva-P1"));

    // A start rolled back leaves nothing.
    let mut tx = f.db().begin().await.unwrap();
    f.sagas
        .start_in(&mut tx, "P2", json!({"importe": 1}))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(f.sagas.show("P2").await.unwrap().is_none());
    assert_eq!(f.commands().await.len(), 1);
    f.finish().await;
}

async fn replies_drive_the_saga_to_completion_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    let reserved = done("reserva", "P1");
    assert_eq!(
        f.sagas.handle(&reserved).await.unwrap(),
        ReplyOutcome::Applied
    );
    // The same event again: its inbox key is recorded.
    assert_eq!(
        f.sagas.handle(&reserved).await.unwrap(),
        ReplyOutcome::Duplicate
    );
    // The same answer in another event (the service answered a resend): ignored by state.
    assert_eq!(
        f.sagas.handle(&done("reserva", "P1")).await.unwrap(),
        ReplyOutcome::Ignored("late or repeated")
    );
    f.sagas.handle(&done("cobro", "P1")).await.unwrap();
    f.sagas.handle(&done("envio", "P1")).await.unwrap();
    let saga = f.saga("P1").await;
    assert_eq!(saga.status, SagaStatus::Completed);
    assert_eq!(saga.results["cobro"]["clave"], json!("cobro-P1"));
    assert_eq!(
        f.commands().await,
        keyed(&[
            ("reserva.pedir", "reserva-P1"),
            ("cobro.pedir", "cobro-P1"),
            ("envio.pedir", "envio-P1"),
        ])
    );
    assert_eq!(
        f.count("SELECT COUNT(*) FROM finales WHERE resultado = 'pagado'")
            .await,
        1
    );
    assert_eq!(
        f.count("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = 'saga.orden'")
            .await,
        4,
        "every distinct reply event's key, the ignored one included"
    );
    let stats = f.sagas.stats().snapshot();
    assert_eq!(
        (stats.completed, stats.duplicates, stats.ignored),
        (1, 1, 1)
    );
    f.finish().await;
}

async fn a_refusal_compensates_the_steps_before_it(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    f.sagas.handle(&done("reserva", "P1")).await.unwrap();
    f.sagas.handle(&failed("cobro", "P1", false)).await.unwrap();
    assert!(f
        .commands()
        .await
        .contains(&("reserva.deshacer".into(), "liberacion-P1".into())));
    assert!(!f
        .commands()
        .await
        .iter()
        .any(|(k, _)| k == "cobro.deshacer"));
    assert_eq!(f.saga("P1").await.status, SagaStatus::Compensating);
    f.sagas
        .handle(&undone("reserva", "liberacion", "P1"))
        .await
        .unwrap();
    assert_eq!(f.saga("P1").await.status, SagaStatus::Compensated);
    assert_eq!(
        f.count("SELECT COUNT(*) FROM finales WHERE resultado = 'cancelado: no'")
            .await,
        1
    );
    f.finish().await;
}

async fn a_failed_write_leaves_the_reply_to_be_delivered_again(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    f.sagas.handle(&done("reserva", "P1")).await.unwrap();
    f.sagas.handle(&done("cobro", "P1")).await.unwrap();
    let before = f.saga("P1").await;
    let outbox_before = f.commands().await;
    f.flow.fail_finish.store(true, Ordering::SeqCst);
    let shipped = done("envio", "P1");
    let err = f.sagas.handle(&shipped).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(f.saga("P1").await, before, "row unchanged");
    assert_eq!(f.commands().await, outbox_before);
    assert_eq!(f.count("SELECT COUNT(*) FROM finales").await, 0);
    f.flow.fail_finish.store(false, Ordering::SeqCst);
    assert_eq!(
        f.sagas.handle(&shipped).await.unwrap(),
        ReplyOutcome::Applied
    );
    assert_eq!(f.saga("P1").await.status, SagaStatus::Completed);
    f.finish().await;
}

async fn timers_resend_then_compensate_then_wait_for_an_operator(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    assert_eq!(f.sagas.tick(10).await.unwrap(), 0, "nothing due yet");
    f.clock.advance(1_000);
    assert_eq!(f.sagas.tick(10).await.unwrap(), 1);
    let resent = f.commands().await;
    assert_eq!(resent.len(), 2);
    assert!(resent
        .iter()
        .all(|c| c == &("reserva.pedir".to_owned(), "reserva-P1".to_owned())));
    assert_eq!(f.saga("P1").await.attempts, 2);
    assert_eq!(f.sagas.next_due().await.unwrap(), Some(T0 + 3_000));

    // No reply by the deadline: the reservation in flight is released.
    f.clock.set(T0 + 10_000);
    while f.sagas.tick(10).await.unwrap() > 0 {
        if f.saga("P1").await.status != SagaStatus::Running {
            break;
        }
    }
    let saga = f.saga("P1").await;
    assert_eq!(saga.status, SagaStatus::Compensating);
    assert_eq!(saga.step, 0);
    // The release is not answered: sent twice, then an operator is needed.
    f.clock.advance(1_000);
    assert_eq!(f.sagas.tick(10).await.unwrap(), 1);
    f.clock.advance(2_000);
    assert_eq!(f.sagas.tick(10).await.unwrap(), 1);
    let saga = f.saga("P1").await;
    assert_eq!(saga.status, SagaStatus::NeedsOperator);
    assert_eq!(saga.next_at_ms, None);
    let releases = f
        .commands()
        .await
        .into_iter()
        .filter(|(k, _)| k == "reserva.deshacer");
    assert_eq!(releases.count(), 2);
    assert_eq!(f.sagas.stats().snapshot().needs_operator, 1);
    let counts = f.sagas.counts().await.unwrap();
    assert_eq!(counts, vec![(SagaStatus::NeedsOperator, 1)]);
    assert_eq!(
        f.sagas
            .list(Some(SagaStatus::NeedsOperator), 10)
            .await
            .unwrap()[0]
            .id,
        "P1"
    );

    f.sagas.retry("P1", "ana").await.unwrap();
    let (saga, history) = f.sagas.show("P1").await.unwrap().unwrap();
    assert_eq!(saga.status, SagaStatus::Compensating);
    let audit = history
        .iter()
        .find(|e| e.what == EventKind::OperatorRetry)
        .unwrap();
    assert_eq!(audit.detail.as_deref(), Some("ana"));
    assert!(matches!(
        f.sagas.retry("P1", "ana").await,
        Err(SagaError::NotWaiting { .. })
    ));
    f.sagas
        .handle(&undone("reserva", "liberacion", "P1"))
        .await
        .unwrap();
    assert_eq!(f.saga("P1").await.status, SagaStatus::Compensated);
    f.finish().await;
}

async fn a_cancel_gives_one_outcome(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    f.sagas.handle(&done("reserva", "P1")).await.unwrap();
    assert_eq!(
        f.sagas.cancel("P1", "cliente").await.unwrap(),
        CancelOutcome::Cancelling
    );
    assert_eq!(
        f.sagas.cancel("P1", "cliente").await.unwrap(),
        CancelOutcome::AlreadyCancelled
    );
    // The charge in flight answers late: ignored, and refunded anyway.
    assert_eq!(
        f.sagas.handle(&done("cobro", "P1")).await.unwrap(),
        ReplyOutcome::Ignored("late or repeated")
    );
    f.sagas
        .handle(&undone("cobro", "reembolso", "P1"))
        .await
        .unwrap();
    f.sagas
        .handle(&undone("reserva", "liberacion", "P1"))
        .await
        .unwrap();
    assert_eq!(f.saga("P1").await.status, SagaStatus::Compensated);
    let undo: Vec<String> = f
        .commands()
        .await
        .into_iter()
        .filter(|(k, _)| k.ends_with(".deshacer"))
        .map(|(_, c)| c)
        .collect();
    assert_eq!(undo.len(), 2);
    assert_eq!(f.count("SELECT COUNT(*) FROM finales").await, 1);

    f.start("P2").await;
    for step in ["reserva", "cobro"] {
        f.sagas.handle(&done(step, "P2")).await.unwrap();
    }
    // The shipment has no compensation: once asked for, a cancel is refused and the saga
    // goes forward.
    assert_eq!(
        f.sagas.cancel("P2", "cliente").await.unwrap(),
        CancelOutcome::PastPointOfNoReturn
    );
    assert_eq!(f.saga("P2").await.status, SagaStatus::Running);
    f.sagas.handle(&done("envio", "P2")).await.unwrap();
    assert_eq!(
        f.sagas.cancel("P2", "cliente").await.unwrap(),
        CancelOutcome::Completed
    );
    assert_eq!(f.saga("P2").await.status, SagaStatus::Completed);
    assert!(matches!(
        f.sagas.cancel("P3", "cliente").await,
        Err(SagaError::NotFound { .. })
    ));
    f.finish().await;
}

async fn unreadable_and_foreign_replies(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    let broken = event("cobro.hecho", json!({"clave": "cobro-P1"}));
    let err = f.sagas.handle(&broken).await.unwrap_err();
    assert!(
        matches!(err, SagaError::BadReply(_)) && !err.is_transient(),
        "{err}"
    );
    assert_eq!(
        f.sagas
            .handle(&event("pedido.creado", json!({})))
            .await
            .unwrap(),
        ReplyOutcome::NotOurs
    );
    assert_eq!(
        f.sagas.handle(&done("reserva", "P9")).await.unwrap(),
        ReplyOutcome::UnknownSaga("P9".into())
    );
    let foreign = event(
        "reserva.hecho",
        json!({"pedido": "P1", "clave": "reserva-P2"}),
    );
    assert_eq!(
        f.sagas.handle(&foreign).await.unwrap(),
        ReplyOutcome::Ignored("another key")
    );
    assert_eq!(f.saga("P1").await.status, SagaStatus::Running);
    f.finish().await;
}

async fn two_orchestrators_fire_each_timer_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    for i in 0..20 {
        f.start(&format!("P{i}")).await;
    }
    let other = Sagas::new(f.db().clone(), f.flow.clone(), Arc::new(f.clock.clone()));
    f.clock.advance(1_000);
    let (a, b) = tokio::join!(f.sagas.tick(100), other.tick(100));
    assert_eq!(a.unwrap() + b.unwrap(), 20);
    for i in 0..20 {
        assert_eq!(f.saga(&format!("P{i}")).await.attempts, 2);
    }
    assert_eq!(f.commands().await.len(), 40, "one resend each");
    f.finish().await;
}

async fn the_same_answer_twice_at_once_moves_the_saga_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    f.start("P1").await;
    let other = Sagas::new(f.db().clone(), f.flow.clone(), Arc::new(f.clock.clone()));
    let (first, second) = (done("reserva", "P1"), done("reserva", "P1"));
    let (a, b) = tokio::join!(f.sagas.handle(&first), other.handle(&second));
    let mut outcomes = vec![a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        outcomes,
        vec![
            ReplyOutcome::Applied,
            ReplyOutcome::Ignored("late or repeated")
        ]
    );
    let charges = f
        .commands()
        .await
        .into_iter()
        .filter(|(k, _)| k == "cobro.pedir");
    assert_eq!(charges.count(), 1);
    f.finish().await;
}

macro_rules! on_both {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::Sqlite).await;
            })+
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::Postgres).await;
            })+
        }
    };
}

on_both!(
    start_writes_row_history_and_first_command_once,
    replies_drive_the_saga_to_completion_once,
    a_refusal_compensates_the_steps_before_it,
    a_failed_write_leaves_the_reply_to_be_delivered_again,
    timers_resend_then_compensate_then_wait_for_an_operator,
    a_cancel_gives_one_outcome,
    unreadable_and_foreign_replies,
    two_orchestrators_fire_each_timer_once,
    the_same_answer_twice_at_once_moves_the_saga_once,
);
