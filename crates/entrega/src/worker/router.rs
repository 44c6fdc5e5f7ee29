//! Handlers, the messages they receive, and the router that picks a handler by `tipo`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{Envelope, HandlerError, Headers, TraceContext};

/// A delivered event: the parsed envelope, where it came from, and which attempt this is.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The parsed envelope.
    pub envelope: Envelope,
    /// Topic it was read from.
    pub topic: String,
    /// Partition within the topic.
    pub partition: u32,
    /// Offset within the partition.
    pub offset: i64,
    /// Partitioning key (`agregado_id` for domain events).
    pub key: Option<String>,
    /// Headers as published.
    pub headers: Headers,
    /// Delivery attempt, starting at 1; grows while transient failures are retried.
    pub attempt: u32,
    /// This delivery's own span: a child of the `traceparent` it was published with, or the
    /// root of a new trace. Events the handler enqueues inside [`crate::trace::scope`] with it
    /// continue the trace (the worker does this for [`Handler::handle`]; a
    /// [`Handler::handle_batch`] of its own scopes each message's work itself).
    pub trace: TraceContext,
}

impl Message {
    /// The idempotency key: `id_evento` in its hyphenated form.
    pub fn id(&self) -> String {
        self.envelope.id.hyphenated().to_string()
    }

    /// The event type (`tipo`).
    pub fn kind(&self) -> &str {
        &self.envelope.kind
    }
}

/// Applies events. Errors are classified: transient ones are retried with backoff, permanent
/// ones go to the dead-letter topic.
///
/// With [`crate::WorkerConfig::key_concurrency`] above 1, calls for different keys run at the
/// same time (never two for one key); a batch then holds messages of a single key.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Applies one event. Return only after its effect (and its idempotency key) committed.
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError>;

    /// Applies consecutive events of one poll, e.g. in one database transaction with each
    /// event still deduplicated by its own key.
    ///
    /// Results are in input order. A vector shorter than the input means the remaining
    /// messages were *not attempted*: nothing of theirs committed, and they are delivered
    /// again in order. Stop at the first transient failure so later messages of the same
    /// partition do not overtake it. The default calls [`Handler::handle`] one by one and
    /// stops right after the first transient error.
    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        handle_each(self, msgs).await
    }
}

/// What [`Handler::handle_batch`] does unless a handler says otherwise: [`Handler::handle`]
/// for each message in order, each in its own trace scope, stopping right after the first
/// transient error (the messages after it are left out, to be delivered again in order).
pub async fn handle_each<H: Handler + ?Sized>(
    handler: &H,
    msgs: &[Message],
) -> Vec<Result<(), HandlerError>> {
    let mut results = Vec::with_capacity(msgs.len());
    for msg in msgs {
        let result = crate::trace::scope(msg.trace, handler.handle(msg)).await;
        let stop = matches!(&result, Err(e) if e.is_transient());
        results.push(result);
        if stop {
            break;
        }
    }
    results
}

/// Where a `tipo` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The handler at this index.
    Handler(usize),
    /// Deliberately not handled: acknowledged and counted.
    Ignored,
    /// Neither routed nor ignored: dead-lettered.
    Unknown,
}

/// Maps event types to handlers. Several types may share one handler (pass the same `Arc`);
/// consecutive messages for the same handler are then handed over as one batch.
#[derive(Clone, Default)]
pub struct Router {
    handlers: Vec<Arc<dyn Handler>>,
    routes: HashMap<String, usize>,
    ignored: HashSet<String>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.routes)
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router that handles nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends events of type `tipo` to `handler`.
    pub fn route(mut self, tipo: impl Into<String>, handler: Arc<dyn Handler>) -> Self {
        let index = match self.handlers.iter().position(|h| Arc::ptr_eq(h, &handler)) {
            Some(index) => index,
            None => {
                self.handlers.push(handler);
                self.handlers.len() - 1
            }
        };
        let tipo = tipo.into();
        self.ignored.remove(&tipo);
        self.routes.insert(tipo, index);
        self
    }

    /// Acknowledges events of type `tipo` without handling them: this consumer deliberately
    /// does not care about them (they are counted as ignored, not dead-lettered).
    pub fn ignore(mut self, tipo: impl Into<String>) -> Self {
        let tipo = tipo.into();
        self.routes.remove(&tipo);
        self.ignored.insert(tipo);
        self
    }

    pub(crate) fn resolve(&self, tipo: &str) -> Route {
        if let Some(index) = self.routes.get(tipo) {
            Route::Handler(*index)
        } else if self.ignored.contains(tipo) {
            Route::Ignored
        } else {
            Route::Unknown
        }
    }

    pub(crate) fn handler(&self, index: usize) -> Option<&Arc<dyn Handler>> {
        self.handlers.get(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Noop;

    #[async_trait]
    impl Handler for Noop {
        async fn handle(&self, _msg: &Message) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    #[test]
    fn routes_ignores_and_shares_handlers() {
        let shared: Arc<dyn Handler> = Arc::new(Noop);
        let router = Router::new()
            .route("pedido.creado", shared.clone())
            .route("pedido.pagado", shared)
            .route("pedido.cancelado", Arc::new(Noop))
            .ignore("pedido.visto");
        assert_eq!(router.resolve("pedido.creado"), Route::Handler(0));
        assert_eq!(router.resolve("pedido.pagado"), Route::Handler(0));
        assert_eq!(router.resolve("pedido.cancelado"), Route::Handler(1));
        assert_eq!(router.resolve("pedido.visto"), Route::Ignored);
        assert_eq!(router.resolve("pedido.otro"), Route::Unknown);
        let router = router.route("pedido.visto", Arc::new(Noop));
        assert_eq!(router.resolve("pedido.visto"), Route::Handler(2));
    }
}
