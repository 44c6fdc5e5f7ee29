//! The saga's state machine, without I/O: a record and an input (start, a reply, its timer,
//! a cancel, an operator's retry) in; the changed record, the commands to send, the history
//! entries and the ending out. The engine writes all of it in one transaction.

use super::flow::{Ending, Reply, StepOutcome, StepSpec};
use super::record::{EventKind, HistoryEntry, Phase, SagaRecord, SagaStatus};

/// What happens to a saga.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Input<'a> {
    /// It was just created: send the first command.
    Start,
    /// A reply arrived.
    Reply(&'a Reply),
    /// Its timer fired (a resend or a deadline).
    Due,
    /// A cancel was asked for, for `reason`.
    Cancel { reason: &'a str },
    /// An operator sends the waiting compensation again.
    OperatorRetry { operator: &'a str },
}

/// What an input did, for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The saga moved (or started).
    Changed,
    /// Nothing to do: a late or repeated reply, a timer that is not due.
    Ignored(&'static str),
    /// A cancel or retry the saga's state refuses.
    Refused,
}

/// A command or compensation to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Send {
    /// The step (an index of the flow's steps).
    pub step: usize,
    /// Its command or its compensation.
    pub phase: Phase,
    /// The key it carries.
    pub key: String,
}

/// The result of one input.
#[derive(Debug, Clone)]
pub(crate) struct Transition {
    /// The record as it must be written (its version not yet bumped).
    pub record: SagaRecord,
    /// What to send, in order.
    pub sends: Vec<Send>,
    /// What to add to the history.
    pub history: Vec<HistoryEntry>,
    /// How the saga ended, if it did.
    pub ending: Option<Ending>,
    /// What the input did.
    pub effect: Effect,
}

/// Applies `input` to `record` at `now_ms`.
pub(crate) fn apply(
    steps: &[StepSpec],
    record: SagaRecord,
    input: Input<'_>,
    now_ms: i64,
) -> Transition {
    let mut m = Machine {
        steps,
        now: now_ms,
        t: Transition {
            record,
            sends: Vec::new(),
            history: Vec::new(),
            ending: None,
            effect: Effect::Changed,
        },
    };
    match input {
        Input::Start => m.start(),
        Input::Reply(reply) => m.reply(reply),
        Input::Due => m.due(),
        Input::Cancel { reason } => m.cancel(reason),
        Input::OperatorRetry { operator } => m.operator_retry(operator),
    }
    m.t
}

struct Machine<'a> {
    steps: &'a [StepSpec],
    now: i64,
    t: Transition,
}

impl Machine<'_> {
    fn rec(&mut self) -> &mut SagaRecord {
        &mut self.t.record
    }

    fn note(&mut self, what: EventKind, step: Option<usize>, phase: Phase, detail: Option<String>) {
        let (name, key) = match step.and_then(|i| self.steps.get(i)) {
            Some(spec) => (spec.name.to_owned(), spec.key(phase, &self.t.record.id)),
            None => (String::new(), None),
        };
        let attempt = match what {
            EventKind::Sent
            | EventKind::Replied
            | EventKind::Failed
            | EventKind::DeadlinePassed => Some(self.t.record.attempts),
            _ => None,
        };
        self.t.record.events += 1;
        self.t.history.push(HistoryEntry {
            n: self.t.record.events,
            at_ms: self.now,
            what,
            step: name,
            phase,
            key,
            attempt,
            detail,
        });
    }

    fn ignore(&mut self, why: &'static str, detail: String) {
        let step = self.t.record.step;
        let phase = self.t.record.phase;
        self.note(
            EventKind::Ignored,
            Some(step),
            phase,
            Some(format!("{why}: {detail}")),
        );
        self.t.effect = Effect::Ignored(why);
    }

    fn delay_ms(&self, step: usize, attempt: u32) -> i64 {
        let delay = self
            .steps
            .get(step)
            .map(|s| s.resend.delay(attempt))
            .unwrap_or_default();
        i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)
    }

    fn start(&mut self) {
        self.note(EventKind::Started, None, Phase::Action, None);
        if self.steps.is_empty() {
            self.complete();
        } else {
            self.send_action(0, 1);
        }
    }

    /// Sends step `step`'s command for the `attempt`-th time.
    fn send_action(&mut self, step: usize, attempt: u32) {
        let Some(spec) = self.steps.get(step) else {
            return self.complete();
        };
        let deadline_ms = i64::try_from(spec.deadline.as_millis()).unwrap_or(i64::MAX);
        let id = self.t.record.id.clone();
        let key = spec.key(Phase::Action, &id).unwrap_or_default();
        let now = self.now;
        let rec = self.rec();
        rec.status = SagaStatus::Running;
        rec.phase = Phase::Action;
        rec.step = step;
        rec.attempts = attempt;
        if attempt == 1 {
            rec.deadline_at_ms = Some(now.saturating_add(deadline_ms));
        }
        self.schedule(step, attempt);
        self.t.sends.push(Send {
            step,
            phase: Phase::Action,
            key,
        });
        self.note(EventKind::Sent, Some(step), Phase::Action, None);
    }

    /// Sets the timer after send `attempt` of `step`: never past a command's deadline.
    fn schedule(&mut self, step: usize, attempt: u32) {
        let next = self.now.saturating_add(self.delay_ms(step, attempt));
        let rec = self.rec();
        rec.next_at_ms = Some(match (rec.phase, rec.deadline_at_ms) {
            (Phase::Action, Some(deadline)) => next.min(deadline),
            _ => next,
        });
    }

    fn complete(&mut self) {
        let rec = self.rec();
        rec.status = SagaStatus::Completed;
        rec.next_at_ms = None;
        rec.deadline_at_ms = None;
        self.note(EventKind::Completed, None, Phase::Action, None);
        self.t.ending = Some(Ending::Completed);
    }

    /// Starts undoing every step up to `through` (inclusive; `None` when no step may have
    /// taken effect), newest first.
    fn compensate(&mut self, through: Option<usize>, reason: String) {
        let rec = self.rec();
        rec.status = SagaStatus::Compensating;
        rec.phase = Phase::Compensation;
        rec.deadline_at_ms = None;
        rec.reason = Some(reason.clone());
        self.note(
            EventKind::Compensating,
            through,
            Phase::Action,
            Some(reason),
        );
        self.next_compensation(through);
    }

    /// Sends the compensation of the newest step up to `through` that has one, or ends the
    /// saga compensated when none is left.
    fn next_compensation(&mut self, through: Option<usize>) {
        let next = through.and_then(|top| {
            (0..=top)
                .rev()
                .find(|&i| self.steps.get(i).is_some_and(|s| s.compensation.is_some()))
        });
        match next {
            Some(step) => self.send_compensation(step, 1),
            None => {
                let rec = self.rec();
                rec.status = SagaStatus::Compensated;
                rec.next_at_ms = None;
                let reason = rec.reason.clone().unwrap_or_default();
                self.note(EventKind::Compensated, None, Phase::Compensation, None);
                self.t.ending = Some(Ending::Compensated { reason });
            }
        }
    }

    fn send_compensation(&mut self, step: usize, attempt: u32) {
        let id = self.t.record.id.clone();
        let Some(key) = self
            .steps
            .get(step)
            .and_then(|s| s.key(Phase::Compensation, &id))
        else {
            return self.next_compensation(step.checked_sub(1));
        };
        let rec = self.rec();
        rec.status = SagaStatus::Compensating;
        rec.phase = Phase::Compensation;
        rec.step = step;
        rec.attempts = attempt;
        self.schedule(step, attempt);
        self.t.sends.push(Send {
            step,
            phase: Phase::Compensation,
            key,
        });
        self.note(EventKind::Sent, Some(step), Phase::Compensation, None);
    }

    fn wait_for_operator(&mut self, reason: String) {
        let rec = self.rec();
        rec.status = SagaStatus::NeedsOperator;
        rec.next_at_ms = None;
        rec.reason = Some(reason.clone());
        let step = rec.step;
        self.note(
            EventKind::NeedsOperator,
            Some(step),
            Phase::Compensation,
            Some(reason),
        );
    }

    fn reply(&mut self, reply: &Reply) {
        let rec = &self.t.record;
        if rec.status.is_final() {
            return self.ignore("the saga is over", reply.key.clone());
        }
        let Some(step) = self.steps.iter().position(|s| s.name == reply.step) else {
            return self.ignore("no such step", reply.step.clone());
        };
        if self.steps[step].key(reply.phase, &rec.id).as_deref() != Some(reply.key.as_str()) {
            return self.ignore("another key", reply.key.clone());
        }
        let awaited = step == rec.step
            && reply.phase == rec.phase
            && match reply.phase {
                Phase::Action => rec.status == SagaStatus::Running,
                // A compensation that succeeds after the saga gave up on it still counts.
                Phase::Compensation => matches!(
                    rec.status,
                    SagaStatus::Compensating | SagaStatus::NeedsOperator
                ),
            };
        if !awaited {
            return self.ignore("late or repeated", reply.key.clone());
        }
        match (&reply.outcome, reply.phase) {
            (StepOutcome::Done(value), Phase::Action) => {
                let name = self.steps[step].name.to_owned();
                self.rec().results.insert(name, value.clone());
                self.note(
                    EventKind::Replied,
                    Some(step),
                    Phase::Action,
                    Some(value.to_string()),
                );
                if step + 1 < self.steps.len() {
                    self.send_action(step + 1, 1);
                } else {
                    self.complete();
                }
            }
            (StepOutcome::Done(value), Phase::Compensation) => {
                self.note(
                    EventKind::Replied,
                    Some(step),
                    Phase::Compensation,
                    Some(value.to_string()),
                );
                self.next_compensation(step.checked_sub(1));
            }
            (StepOutcome::Failed { reason, transient }, Phase::Action) => {
                self.note(
                    EventKind::Failed,
                    Some(step),
                    Phase::Action,
                    Some(reason.clone()),
                );
                let past_deadline = rec_deadline_passed(&self.t.record, self.now);
                if !transient {
                    // Refused for good: the step took no effect, the ones before it did.
                    self.compensate(step.checked_sub(1), reason.clone());
                } else if past_deadline {
                    self.compensate(Some(step), format!("deadline passed: {reason}"));
                } else {
                    // Sent again when the timer fires, not at once.
                    let attempt = self.t.record.attempts;
                    self.schedule(step, attempt);
                }
            }
            (StepOutcome::Failed { reason, transient }, Phase::Compensation) => {
                self.note(
                    EventKind::Failed,
                    Some(step),
                    Phase::Compensation,
                    Some(reason.clone()),
                );
                let limit = self.steps[step].compensation_attempts;
                if !transient {
                    self.wait_for_operator(format!("compensation refused: {reason}"));
                } else if self.t.record.attempts >= limit {
                    self.wait_for_operator(format!("compensation failed {limit} times: {reason}"));
                } else if self.t.record.status == SagaStatus::Compensating {
                    let attempt = self.t.record.attempts;
                    self.schedule(step, attempt);
                }
            }
        }
    }

    fn due(&mut self) {
        let rec = &self.t.record;
        let due = rec.next_at_ms.is_some_and(|at| at <= self.now);
        if !due {
            self.t.effect = Effect::Ignored("not due");
            return;
        }
        let (step, attempts) = (rec.step, rec.attempts);
        match rec.status {
            SagaStatus::Running if rec_deadline_passed(rec, self.now) => {
                self.note(EventKind::DeadlinePassed, Some(step), Phase::Action, None);
                let name = self.steps.get(step).map(|s| s.name).unwrap_or_default();
                // No reply does not mean no effect: the step is undone too.
                self.compensate(Some(step), format!("step `{name}` got no reply in time"));
            }
            SagaStatus::Running => self.send_action(step, attempts.saturating_add(1)),
            SagaStatus::Compensating => {
                let limit = self.steps.get(step).map_or(1, |s| s.compensation_attempts);
                if attempts >= limit {
                    self.wait_for_operator(format!("compensation unanswered after {limit} sends"));
                } else {
                    self.send_compensation(step, attempts.saturating_add(1));
                }
            }
            SagaStatus::Completed | SagaStatus::Compensated | SagaStatus::NeedsOperator => {
                self.rec().next_at_ms = None;
                self.t.effect = Effect::Ignored("not due");
            }
        }
    }

    fn cancel(&mut self, reason: &str) {
        let rec = &self.t.record;
        let step = rec.step;
        // A step without a compensation cannot be undone: once its command is out, the saga
        // goes forward (a deadline or a refusal still ends it compensated).
        let undoable = self
            .steps
            .get(step)
            .is_some_and(|s| s.compensation.is_some());
        if rec.status != SagaStatus::Running || !undoable {
            self.t.effect = Effect::Refused;
            return;
        }
        self.note(
            EventKind::CancelRequested,
            Some(step),
            Phase::Action,
            Some(reason.to_owned()),
        );
        // The step in flight may take effect even now: it is undone with the others.
        self.compensate(Some(step), reason.to_owned());
    }

    fn operator_retry(&mut self, operator: &str) {
        if self.t.record.status != SagaStatus::NeedsOperator {
            self.t.effect = Effect::Refused;
            return;
        }
        let step = self.t.record.step;
        self.note(
            EventKind::OperatorRetry,
            Some(step),
            Phase::Compensation,
            Some(operator.to_owned()),
        );
        self.send_compensation(step, 1);
    }
}

fn rec_deadline_passed(rec: &SagaRecord, now_ms: i64) -> bool {
    rec.deadline_at_ms.is_some_and(|d| d <= now_ms)
}
