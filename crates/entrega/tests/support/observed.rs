//! A handler that takes a little time per message and observes how it is called: how many
//! calls run at once, whether two calls of one key ever overlap, how often each message is
//! handed over, and the order in which effects are first applied.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use entrega::{Handler, Message};
use entrega_core::HandlerError;
use entrega_testkit::memory::MemoryInbox;
use tokio::time::Instant;

use super::handlers::{Fail, Step};

/// One completed call: which message, and when it ran.
#[derive(Debug, Clone)]
pub struct Span {
    pub key: Option<String>,
    pub partition: u32,
    pub offset: i64,
    pub start: Instant,
    pub end: Instant,
}

/// An effect applied for the first time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub id: String,
    pub key: Option<String>,
    pub n: u64,
}

type Script = Box<dyn Fn(&Message) -> Step + Send + Sync>;

pub struct Observed {
    pub inbox: MemoryInbox,
    delay: Duration,
    script: Script,
    running: AtomicUsize,
    max_running: AtomicUsize,
    running_keys: Mutex<HashSet<(u32, Option<String>)>>,
    key_overlaps: AtomicUsize,
    spans: Mutex<Vec<Span>>,
    calls: Mutex<HashMap<String, usize>>,
    applied: Mutex<Vec<Applied>>,
}

/// Undoes a call's "running" marks even when the call panics or is cancelled.
struct Running<'a> {
    handler: &'a Observed,
    key: (u32, Option<String>),
    owns_key: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.handler.running.fetch_sub(1, Ordering::SeqCst);
        if self.owns_key {
            self.handler.running_keys.lock().unwrap().remove(&self.key);
        }
    }
}

impl Observed {
    pub fn new(delay: Duration, script: impl Fn(&Message) -> Step + Send + Sync + 'static) -> Self {
        Self {
            inbox: MemoryInbox::new(),
            delay,
            script: Box::new(script),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            running_keys: Mutex::default(),
            key_overlaps: AtomicUsize::new(0),
            spans: Mutex::default(),
            calls: Mutex::default(),
            applied: Mutex::default(),
        }
    }

    pub fn ok(delay: Duration) -> Self {
        Self::new(delay, |_| Step::Ok)
    }

    /// The most calls seen running at once.
    pub fn max_running(&self) -> usize {
        self.max_running.load(Ordering::SeqCst)
    }

    /// Calls that started while another call of the same partition and key was running.
    pub fn key_overlaps(&self) -> usize {
        self.key_overlaps.load(Ordering::SeqCst)
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// How often the message `id` was handed to the handler.
    pub fn calls_of(&self, id: &str) -> usize {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Effects in the order they were first applied.
    pub fn applied(&self) -> Vec<Applied> {
        self.applied.lock().unwrap().clone()
    }

    /// `data.n` of the effects applied for `key`, in application order.
    pub fn applied_ns(&self, key: &str) -> Vec<u64> {
        self.applied()
            .into_iter()
            .filter(|a| a.key.as_deref() == Some(key))
            .map(|a| a.n)
            .collect()
    }

    fn enter(&self, msg: &Message) -> Running<'_> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        let key = (msg.partition, msg.key.clone());
        let owns_key = self.running_keys.lock().unwrap().insert(key.clone());
        if !owns_key {
            self.key_overlaps.fetch_add(1, Ordering::SeqCst);
        }
        Running {
            handler: self,
            key,
            owns_key,
        }
    }
}

#[async_trait]
impl Handler for Observed {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        *self.calls.lock().unwrap().entry(msg.id()).or_default() += 1;
        let _running = self.enter(msg);
        let start = Instant::now();
        tokio::time::sleep(self.delay).await;
        let result = match (self.script)(msg) {
            Step::Ok => {
                // The effect and its idempotency key commit together, at the end of the call.
                if self.inbox.claim("test", &msg.id()) {
                    self.applied.lock().unwrap().push(Applied {
                        id: msg.id(),
                        key: msg.key.clone(),
                        n: msg.envelope.data["n"].as_u64().unwrap_or(u64::MAX),
                    });
                }
                Ok(())
            }
            Step::Transient => Err(HandlerError::transient(Fail("inventario db restarting"))),
            Step::Permanent => Err(HandlerError::permanent(Fail("stock insuficiente"))),
            Step::Panic => panic!("bug in handler"),
        };
        self.spans.lock().unwrap().push(Span {
            key: msg.key.clone(),
            partition: msg.partition,
            offset: msg.offset,
            start,
            end: Instant::now(),
        });
        result
    }
}
