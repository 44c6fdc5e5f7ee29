//! What a saga is made of, as its author declares it: the steps in order, each with the key
//! prefix of its command and, when it can be undone, of its compensation; and the
//! [`SagaFlow`] that turns a step into the command event and a reply event back into a
//! [`Reply`].

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Envelope, NewEvent, StoreError};
use serde_json::Value;

use super::record::{Phase, SagaRecord};
use crate::db::Tx;
use crate::Backoff;

/// One step of a saga: a local transaction of another service, asked for by a command and
/// answered by a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    /// The step's name, in replies and in the history (`reserva`, `cobro`, ...).
    pub name: &'static str,
    /// The command's key is `<key_prefix>-<saga id>` (`reserva-<pedido>`): the same on every
    /// send, so the service that applies it recognises a repeat.
    pub key_prefix: &'static str,
    /// The compensation's key prefix (`reembolso`), or `None` for a step with nothing to
    /// undo.
    pub compensation: Option<&'static str>,
    /// Delays between sends of the same command (or compensation) while no reply comes,
    /// and after a transient failure.
    pub resend: Backoff,
    /// How long after its first send the step may take: past it, the saga compensates.
    pub deadline: Duration,
    /// Sends of a compensation before the saga waits for an operator.
    pub compensation_attempts: u32,
}

impl StepSpec {
    /// A step with no compensation, resent after 2, 4, 8 ... up to 30 s (10% jitter), a 60 s
    /// deadline, and 10 sends of a compensation once it has one.
    pub fn new(name: &'static str, key_prefix: &'static str) -> Self {
        Self {
            name,
            key_prefix,
            compensation: None,
            resend: Backoff::new(Duration::from_secs(2), Duration::from_secs(30)).with_jitter(0.1),
            deadline: Duration::from_secs(60),
            compensation_attempts: 10,
        }
    }

    /// Undone by a compensation whose key is `<prefix>-<saga id>`.
    pub fn compensated_by(mut self, prefix: &'static str) -> Self {
        self.compensation = Some(prefix);
        self
    }

    /// Another schedule of resends.
    pub fn resend(mut self, backoff: Backoff) -> Self {
        self.resend = backoff;
        self
    }

    /// Another deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Another limit of compensation sends (at least 1).
    pub fn compensation_attempts(mut self, attempts: u32) -> Self {
        self.compensation_attempts = attempts.max(1);
        self
    }

    /// The key of this step's command (`Phase::Action`) or compensation for saga `saga_id`;
    /// `None` for the compensation of a step that has none.
    pub fn key(&self, phase: Phase, saga_id: &str) -> Option<String> {
        let prefix = match phase {
            Phase::Action => self.key_prefix,
            Phase::Compensation => self.compensation?,
        };
        Some(format!("{prefix}-{saga_id}"))
    }
}

/// A reply to a command or a compensation, as [`SagaFlow::reply`] reads it from an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The saga it answers.
    pub saga_id: String,
    /// The step's name.
    pub step: String,
    /// Whether it answers the step's command or its compensation.
    pub phase: Phase,
    /// The key of what it answers: a reply under another key is ignored.
    pub key: String,
    /// What happened.
    pub outcome: StepOutcome,
}

/// What a service answered.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Done, with what the step returned (kept in the saga's results under its name).
    Done(Value),
    /// Not done. A permanent failure of a command compensates the steps before it; a
    /// transient one is sent again until the step's deadline.
    Failed {
        /// Why, for the history and the saga's reason.
        reason: String,
        /// Whether sending the same command again may succeed.
        transient: bool,
    },
}

/// How a saga ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Every step done.
    Completed,
    /// Every step that may have taken effect undone, for `reason`.
    Compensated {
        /// Why the saga compensated (a step's failure, a deadline, a cancel).
        reason: String,
    },
}

/// A flow could not build a command or read a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct FlowError {
    /// What was wrong.
    pub reason: String,
}

impl FlowError {
    /// An error saying `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

/// A saga's behaviour: its steps, how each is asked for and undone, how replies read, and
/// what the orchestrator's own service does when it ends.
#[async_trait]
pub trait SagaFlow: Send + Sync + 'static {
    /// The saga type, stored in `entrega_sagas.kind` (`pedido`).
    fn kind(&self) -> &str;

    /// The steps, in the order they run (at least one).
    fn steps(&self) -> &[StepSpec];

    /// The event that asks for `step` (an index of [`SagaFlow::steps`]) of `saga`, carrying
    /// `key`; it goes out through the outbox in the transaction that changes the saga.
    fn command(&self, saga: &SagaRecord, step: usize, key: &str) -> Result<NewEvent, FlowError>;

    /// The event that undoes `step` of `saga`, carrying `key`. The service applying it must
    /// treat a compensation of something it never did as done (a command may have been lost,
    /// or may still arrive: it must then refuse it).
    fn compensation(
        &self,
        saga: &SagaRecord,
        step: usize,
        key: &str,
    ) -> Result<NewEvent, FlowError>;

    /// The reply an event carries, or `None` for an event that is not a reply of this saga
    /// (acknowledged without effect).
    fn reply(&self, envelope: &Envelope) -> Result<Option<Reply>, FlowError>;

    /// Runs in the transaction that ends `saga` (the order marked paid or cancelled, an
    /// event enqueued). Does nothing unless overridden.
    async fn finished(
        &self,
        _tx: &mut Tx,
        _saga: &SagaRecord,
        _ending: &Ending,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}
