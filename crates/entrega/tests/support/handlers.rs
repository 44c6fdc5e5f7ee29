//! Test handlers whose behaviour per message is scripted, and whose effects go through an
//! in-memory idempotency table, so "applied once" is observable.

use std::sync::Mutex;

use async_trait::async_trait;
use entrega::{Handler, Message};
use entrega_core::HandlerError;
use entrega_testkit::memory::MemoryInbox;

/// What the handler does with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Ok,
    Transient,
    Permanent,
    Panic,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fail(pub &'static str);

type Script = Box<dyn Fn(&Message) -> Step + Send + Sync>;

/// Applies a message by claiming its id in an inbox and recording it when new.
pub struct Scripted {
    pub inbox: MemoryInbox,
    applied: Mutex<Vec<Message>>,
    calls: Mutex<Vec<(String, u32)>>,
    batches: Mutex<Vec<usize>>,
    batch_cap: Option<usize>,
    script: Script,
}

impl Scripted {
    pub fn new(script: impl Fn(&Message) -> Step + Send + Sync + 'static) -> Self {
        Self {
            inbox: MemoryInbox::new(),
            applied: Mutex::default(),
            calls: Mutex::default(),
            batches: Mutex::default(),
            batch_cap: None,
            script: Box::new(script),
        }
    }

    /// Every message succeeds.
    pub fn ok() -> Self {
        Self::new(|_| Step::Ok)
    }

    /// `handle_batch` attempts at most `cap` messages and returns that many results.
    pub fn with_batch_cap(mut self, cap: usize) -> Self {
        self.batch_cap = Some(cap);
        self
    }

    /// Messages whose effect was applied (first delivery of each id), in order.
    pub fn applied(&self) -> Vec<Message> {
        self.applied.lock().unwrap().clone()
    }

    /// `data.n` of applied messages with `key`, in order.
    pub fn applied_ns(&self, key: &str) -> Vec<u64> {
        self.applied()
            .iter()
            .filter(|m| m.key.as_deref() == Some(key))
            .filter_map(|m| m.envelope.data["n"].as_u64())
            .collect()
    }

    /// Attempts seen for one event id.
    pub fn attempts_of(&self, id: &str) -> Vec<u32> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, a)| *a)
            .collect()
    }

    /// Every call, as (id, attempt).
    pub fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    /// Sizes of the batches handed over.
    pub fn batches(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }
}

#[async_trait]
impl Handler for Scripted {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        self.calls.lock().unwrap().push((msg.id(), msg.attempt));
        match (self.script)(msg) {
            Step::Ok => {
                if self.inbox.claim("test", &msg.id()) {
                    self.applied.lock().unwrap().push(msg.clone());
                }
                Ok(())
            }
            Step::Transient => Err(HandlerError::transient(Fail("inventario db restarting"))),
            Step::Permanent => {
                Err(HandlerError::permanent(Fail("stock insuficiente")).with_code("sin_stock"))
            }
            Step::Panic => panic!("bug in handler"),
        }
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        self.batches.lock().unwrap().push(msgs.len());
        let take = self.batch_cap.unwrap_or(msgs.len()).min(msgs.len());
        let mut results = Vec::new();
        for msg in &msgs[..take] {
            let result = self.handle(msg).await;
            let stop = matches!(&result, Err(e) if e.is_transient());
            results.push(result);
            if stop {
                break;
            }
        }
        results
    }
}
