//! Fault injection for publishers: a transport that is down, or one that stores a message and
//! then loses the confirmation (the case that makes "mark before confirm" lose events).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use entrega_core::{OutgoingMessage, Publisher, TransportError};

/// What a [`FlakyPublisher`] does to a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passes the batch through.
    None,
    /// Fails without storing anything (transport down).
    Unavailable,
    /// Stores the batch, then reports failure (confirmation lost on the way back).
    LoseConfirmation,
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    fault: Fault,
    /// How many more publishes get the fault; `None` = until changed.
    remaining: Option<u32>,
}

/// Wraps a publisher and injects [`Fault`]s, counting calls and failures.
#[derive(Debug)]
pub struct FlakyPublisher<P: ?Sized = dyn Publisher> {
    plan: Mutex<Plan>,
    calls: AtomicU64,
    failures: AtomicU64,
    inner: Arc<P>,
}

/// The error every injected fault returns: transient, as a transport outage is.
#[derive(Debug, thiserror::Error)]
#[error("injected transport fault")]
pub struct InjectedFault;

impl<P: Publisher + ?Sized> FlakyPublisher<P> {
    /// A publisher that passes everything through until told otherwise.
    pub fn new(inner: Arc<P>) -> Self {
        Self {
            plan: Mutex::new(Plan {
                fault: Fault::None,
                remaining: None,
            }),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            inner,
        }
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        // A poisoned lock only means a test thread panicked; the plan is still usable.
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `fault` to every publish from now on.
    pub fn set(&self, fault: Fault) {
        *self.plan() = Plan {
            fault,
            remaining: None,
        };
    }

    /// Applies `fault` to the next `times` publishes, then passes again.
    pub fn set_times(&self, fault: Fault, times: u32) {
        *self.plan() = Plan {
            fault,
            remaining: Some(times),
        };
    }

    /// Stops injecting faults.
    pub fn recover(&self) {
        self.set(Fault::None);
    }

    /// Publishes attempted so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Publishes that returned an injected error.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    /// The wrapped publisher.
    pub fn inner(&self) -> &Arc<P> {
        &self.inner
    }

    fn next_fault(&self) -> Fault {
        let mut plan = self.plan();
        match plan.remaining {
            Some(0) => Fault::None,
            Some(n) => {
                plan.remaining = Some(n - 1);
                plan.fault
            }
            None => plan.fault,
        }
    }
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for FlakyPublisher<P> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.next_fault() {
            Fault::None => self.inner.publish(batch).await,
            Fault::Unavailable => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                Err(TransportError::unavailable(InjectedFault))
            }
            Fault::LoseConfirmation => {
                self.inner.publish(batch).await?;
                self.failures.fetch_add(1, Ordering::SeqCst);
                Err(TransportError::unavailable(InjectedFault))
            }
        }
    }
}
