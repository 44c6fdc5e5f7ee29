//! The state machine on its own: every transition, on exact times.

use std::time::Duration;

use serde_json::json;

use super::flow::{Ending, Reply, StepOutcome, StepSpec};
use super::machine::{apply, Effect, Input, Send, Transition};
use super::record::{EventKind, Phase, SagaRecord, SagaStatus};
use crate::Backoff;

const T0: i64 = 1_000_000;

fn steps() -> Vec<StepSpec> {
    let exact = Backoff::new(Duration::from_secs(1), Duration::from_secs(8)).with_jitter(0.0);
    let step = |name, prefix| {
        StepSpec::new(name, prefix)
            .resend(exact)
            .deadline(Duration::from_secs(10))
            .compensation_attempts(3)
    };
    vec![
        step("reserva", "reserva").compensated_by("liberacion"),
        step("cobro", "cobro").compensated_by("reembolso"),
        step("reparto", "reparto"),
    ]
}

fn started() -> Transition {
    let record = SagaRecord::new("pedido", "P1", json!({"importe": 100}), T0);
    apply(&steps(), record, Input::Start, T0)
}

fn reply(step: &str, phase: Phase, key: &str, outcome: StepOutcome) -> Reply {
    Reply {
        saga_id: "P1".into(),
        step: step.into(),
        phase,
        key: key.into(),
        outcome,
    }
}

fn done(step: &str, key: &str) -> Reply {
    reply(
        step,
        Phase::Action,
        key,
        StepOutcome::Done(json!({"ok": step})),
    )
}

fn failed(step: &str, phase: Phase, key: &str, transient: bool) -> Reply {
    let outcome = StepOutcome::Failed {
        reason: format!("{key} failed"),
        transient,
    };
    reply(step, phase, key, outcome)
}

fn on(t: Transition, r: &Reply, now: i64) -> Transition {
    apply(&steps(), t.record, Input::Reply(r), now)
}

fn due(t: Transition, now: i64) -> Transition {
    apply(&steps(), t.record, Input::Due, now)
}

fn sent(step: usize, phase: Phase, key: &str) -> Vec<Send> {
    vec![Send {
        step,
        phase,
        key: key.into(),
    }]
}

#[test]
fn start_sends_the_first_command_with_its_key_and_timers() {
    let t = started();
    assert_eq!(t.sends, sent(0, Phase::Action, "reserva-P1"));
    assert_eq!(t.record.status, SagaStatus::Running);
    assert_eq!(t.record.attempts, 1);
    assert_eq!(t.record.next_at_ms, Some(T0 + 1_000));
    assert_eq!(t.record.deadline_at_ms, Some(T0 + 10_000));
    let what: Vec<EventKind> = t.history.iter().map(|e| e.what).collect();
    assert_eq!(what, [EventKind::Started, EventKind::Sent]);
    assert_eq!(t.record.events, 2);
}

#[test]
fn every_step_done_completes_with_their_results() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0 + 5);
    assert_eq!(t.sends, sent(1, Phase::Action, "cobro-P1"));
    let t = on(t, &done("cobro", "cobro-P1"), T0 + 6);
    assert_eq!(t.sends, sent(2, Phase::Action, "reparto-P1"));
    let t = on(t, &done("reparto", "reparto-P1"), T0 + 7);
    assert!(t.sends.is_empty());
    assert_eq!(t.ending, Some(Ending::Completed));
    assert_eq!(t.record.status, SagaStatus::Completed);
    assert_eq!(t.record.next_at_ms, None);
    assert_eq!(t.record.results.len(), 3);
    assert_eq!(t.record.results["cobro"], json!({"ok": "cobro"}));
}

#[test]
fn a_permanent_failure_undoes_only_the_steps_before_it() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0 + 5);
    let t = on(
        t,
        &failed("cobro", Phase::Action, "cobro-P1", false),
        T0 + 6,
    );
    assert_eq!(t.sends, sent(0, Phase::Compensation, "liberacion-P1"));
    assert_eq!(t.record.status, SagaStatus::Compensating);
    assert_eq!(t.record.reason.as_deref(), Some("cobro-P1 failed"));
    let compensated = reply(
        "reserva",
        Phase::Compensation,
        "liberacion-P1",
        StepOutcome::Done(json!({})),
    );
    let t = on(t, &compensated, T0 + 7);
    assert!(t.sends.is_empty());
    assert_eq!(
        t.ending,
        Some(Ending::Compensated {
            reason: "cobro-P1 failed".into()
        })
    );
    assert_eq!(t.record.status, SagaStatus::Compensated);
}

#[test]
fn a_first_step_refused_ends_compensated_with_nothing_to_undo() {
    let t = on(
        started(),
        &failed("reserva", Phase::Action, "reserva-P1", false),
        T0 + 5,
    );
    assert!(t.sends.is_empty());
    assert_eq!(t.record.status, SagaStatus::Compensated);
    assert!(matches!(t.ending, Some(Ending::Compensated { .. })));
}

#[test]
fn a_transient_failure_is_sent_again_by_the_timer_with_the_same_key() {
    let t = on(
        started(),
        &failed("reserva", Phase::Action, "reserva-P1", true),
        T0 + 100,
    );
    assert!(t.sends.is_empty(), "not at once");
    assert_eq!(t.record.next_at_ms, Some(T0 + 1_100));
    let early = due(t, T0 + 1_000);
    assert_eq!(early.effect, Effect::Ignored("not due"));
    let t = due(early, T0 + 1_100);
    assert_eq!(t.sends, sent(0, Phase::Action, "reserva-P1"));
    assert_eq!(t.record.attempts, 2);
    assert_eq!(t.record.next_at_ms, Some(T0 + 1_100 + 2_000));
    assert_eq!(
        t.record.deadline_at_ms,
        Some(T0 + 10_000),
        "the deadline stays"
    );
}

#[test]
fn resends_stop_at_the_deadline_which_undoes_the_step_in_flight_too() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0);
    // cobro sent at T0: resends at +1, +3, +7 s, then the deadline at +10 s.
    let mut t = t;
    for at in [1_000, 3_000, 7_000] {
        t = due(t, T0 + at);
        assert_eq!(t.sends, sent(1, Phase::Action, "cobro-P1"));
    }
    assert_eq!(
        t.record.next_at_ms,
        Some(T0 + 10_000),
        "capped at the deadline"
    );
    let t = due(t, T0 + 10_000);
    assert_eq!(t.sends, sent(1, Phase::Compensation, "reembolso-P1"));
    assert!(t
        .history
        .iter()
        .any(|e| e.what == EventKind::DeadlinePassed));
    assert_eq!(t.record.status, SagaStatus::Compensating);
}

#[test]
fn a_transient_failure_after_the_deadline_compensates() {
    let t = started();
    let t = on(
        t,
        &failed("reserva", Phase::Action, "reserva-P1", true),
        T0 + 10_000,
    );
    assert_eq!(t.sends, sent(0, Phase::Compensation, "liberacion-P1"));
}

#[test]
fn repeated_late_and_foreign_replies_change_nothing_but_the_history() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0 + 5);
    let before = t.record.clone();
    for r in [
        done("reserva", "reserva-P1"),
        done("cobro", "cobro-P2"),
        done("envio", "envio-P1"),
        failed("reserva", Phase::Compensation, "liberacion-P1", false),
    ] {
        let after = on(t.clone(), &r, T0 + 6);
        assert!(matches!(after.effect, Effect::Ignored(_)), "{r:?}");
        assert!(after.sends.is_empty());
        let mut same = after.record.clone();
        same.events = before.events;
        assert_eq!(same, before);
        assert_eq!(after.history.len(), 1);
        assert_eq!(after.history[0].what, EventKind::Ignored);
    }
}

#[test]
fn a_failing_compensation_is_retried_then_waits_for_an_operator() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0);
    let t = on(t, &failed("cobro", Phase::Action, "cobro-P1", false), T0);
    let refusal = failed("reserva", Phase::Compensation, "liberacion-P1", true);
    let t = on(t, &refusal, T0 + 10);
    assert!(t.sends.is_empty());
    let t = due(t, T0 + 1_010);
    assert_eq!(t.sends, sent(0, Phase::Compensation, "liberacion-P1"));
    let t = on(t, &refusal, T0 + 1_020);
    let t = due(t, T0 + 5_000);
    assert_eq!(t.record.attempts, 3);
    let t = on(t, &refusal, T0 + 5_010);
    assert_eq!(t.record.status, SagaStatus::NeedsOperator);
    assert_eq!(t.record.next_at_ms, None);
    assert!(t.ending.is_none());
    assert_eq!(
        due(t.clone(), T0 + 99_000).effect,
        Effect::Ignored("not due")
    );

    let t = apply(
        &steps(),
        t.record,
        Input::OperatorRetry { operator: "ana" },
        T0 + 60_000,
    );
    assert_eq!(t.sends, sent(0, Phase::Compensation, "liberacion-P1"));
    assert_eq!(t.record.status, SagaStatus::Compensating);
    assert_eq!(t.record.attempts, 1);
    assert_eq!(t.history[0].detail.as_deref(), Some("ana"));
    let ok = reply(
        "reserva",
        Phase::Compensation,
        "liberacion-P1",
        StepOutcome::Done(json!({})),
    );
    let t = on(t, &ok, T0 + 60_010);
    assert_eq!(t.record.status, SagaStatus::Compensated);
}

#[test]
fn an_unanswered_compensation_waits_for_an_operator_after_its_sends() {
    let t = on(
        started(),
        &failed("reserva", Phase::Action, "reserva-P1", true),
        T0 + 10_000,
    );
    assert_eq!(t.record.attempts, 1);
    let t = due(t, T0 + 11_000);
    let t = due(t, T0 + 13_000);
    assert_eq!(t.record.attempts, 3);
    let t = due(t, T0 + 17_000);
    assert!(t.sends.is_empty());
    assert_eq!(t.record.status, SagaStatus::NeedsOperator);
}

#[test]
fn a_refused_compensation_goes_to_an_operator_at_once() {
    let t = on(
        started(),
        &failed("reserva", Phase::Action, "reserva-P1", true),
        T0 + 10_000,
    );
    let t = on(
        t,
        &failed("reserva", Phase::Compensation, "liberacion-P1", false),
        T0 + 10_001,
    );
    assert_eq!(t.record.status, SagaStatus::NeedsOperator);
}

#[test]
fn a_late_compensation_success_still_counts_while_an_operator_is_awaited() {
    let t = on(
        started(),
        &failed("reserva", Phase::Action, "reserva-P1", true),
        T0 + 10_000,
    );
    let t = on(
        t,
        &failed("reserva", Phase::Compensation, "liberacion-P1", false),
        T0 + 10_001,
    );
    let ok = reply(
        "reserva",
        Phase::Compensation,
        "liberacion-P1",
        StepOutcome::Done(json!({})),
    );
    let t = on(t, &ok, T0 + 10_002);
    assert_eq!(t.record.status, SagaStatus::Compensated);
}

#[test]
fn a_cancel_while_running_undoes_the_step_in_flight_and_the_ones_before() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0);
    let t = apply(
        &steps(),
        t.record,
        Input::Cancel { reason: "cliente" },
        T0 + 1,
    );
    assert_eq!(t.sends, sent(1, Phase::Compensation, "reembolso-P1"));
    // The charge's answer arrives late: ignored, the refund stands.
    let t = on(t, &done("cobro", "cobro-P1"), T0 + 2);
    assert_eq!(t.effect, Effect::Ignored("late or repeated"));
    let refunded = reply(
        "cobro",
        Phase::Compensation,
        "reembolso-P1",
        StepOutcome::Done(json!({})),
    );
    let t = on(t, &refunded, T0 + 3);
    assert_eq!(t.sends, sent(0, Phase::Compensation, "liberacion-P1"));
    let again = apply(
        &steps(),
        t.record.clone(),
        Input::Cancel { reason: "otra vez" },
        T0 + 4,
    );
    assert_eq!(again.effect, Effect::Refused);
    let released = reply(
        "reserva",
        Phase::Compensation,
        "liberacion-P1",
        StepOutcome::Done(json!({})),
    );
    let t = on(t, &released, T0 + 5);
    assert_eq!(
        t.ending,
        Some(Ending::Compensated {
            reason: "cliente".into()
        })
    );
}

#[test]
fn a_cancel_after_completion_is_refused() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0);
    let t = on(t, &done("cobro", "cobro-P1"), T0);
    let t = on(t, &done("reparto", "reparto-P1"), T0);
    let t = apply(
        &steps(),
        t.record,
        Input::Cancel { reason: "cliente" },
        T0 + 1,
    );
    assert_eq!(t.effect, Effect::Refused);
    assert!(t.sends.is_empty() && t.history.is_empty());
    assert_eq!(t.record.status, SagaStatus::Completed);
}

#[test]
fn a_cancel_while_a_step_without_compensation_is_out_is_refused() {
    let t = on(started(), &done("reserva", "reserva-P1"), T0);
    let t = on(t, &done("cobro", "cobro-P1"), T0);
    assert_eq!(t.sends, sent(2, Phase::Action, "reparto-P1"));
    let refused = apply(
        &steps(),
        t.record.clone(),
        Input::Cancel { reason: "cliente" },
        T0 + 1,
    );
    assert_eq!(refused.effect, Effect::Refused);
    assert!(refused.sends.is_empty() && refused.history.is_empty());
    assert_eq!(refused.record.status, SagaStatus::Running);
    // The courier's answer still completes it.
    let t = on(refused, &done("reparto", "reparto-P1"), T0 + 2);
    assert_eq!(t.ending, Some(Ending::Completed));
}

#[test]
fn an_operator_retry_of_a_saga_not_waiting_is_refused() {
    let t = apply(
        &steps(),
        started().record,
        Input::OperatorRetry { operator: "ana" },
        T0,
    );
    assert_eq!(t.effect, Effect::Refused);
    assert!(t.sends.is_empty());
}
