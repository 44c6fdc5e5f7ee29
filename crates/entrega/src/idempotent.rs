//! The one obvious way to consume idempotently: typed handlers that run inside a transaction
//! the engine opens, with the message's key claimed in it (`mensajes_procesados`) and
//! committed together with the effect.
//!
//! ```no_run
//! use async_trait::async_trait;
//! use entrega::db::query;
//! use entrega::{Apply, Db, Event, HandlerError, Idempotent, Message, Tx};
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! struct PedidoPagado {
//!     id: String,
//! }
//!
//! impl Event for PedidoPagado {
//!     const TIPO: &'static str = "pedido.pagado";
//!     const VERSION: u32 = 1;
//! }
//!
//! struct MarkPaid;
//!
//! #[async_trait]
//! impl Apply<PedidoPagado> for MarkPaid {
//!     async fn apply(&self, tx: &mut Tx, event: PedidoPagado, _: &Message) -> Result<(), HandlerError> {
//!         tx.execute(query("UPDATE envios SET pagado = 1 WHERE pedido = $1").bind(event.id))
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(db: Db) {
//! let router = Idempotent::new(db, "reparto.pagos").on(MarkPaid).router();
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use entrega_contracts::{transition, Upcasters, View};
use entrega_core::{HandlerError, Processed, StoreError};

use crate::{Db, Handler, Message, Router, Tx};

impl Db {
    /// Applies `effect` once per `key` of `consumer`: in one transaction that first claims
    /// the key in `mensajes_procesados`, then runs `effect` and commits both together. A key
    /// claimed before is a duplicate: nothing runs ([`Processed::Duplicate`]). An error from
    /// `effect` (or from the commit) takes the effect and the claim back together.
    ///
    /// The building block of [`Idempotent`], for consumers whose messages are not typed
    /// events, and for an effect that follows a call to another system (made before, with
    /// its own idempotency key, so no transaction stays open across it).
    ///
    /// ```no_run
    /// # async fn run(db: entrega::Db) -> Result<(), entrega::StoreError> {
    /// use entrega::db::query;
    ///
    /// let applied = db
    ///     .once("reparto.envios", "6f1c9e2a-...", async |tx| {
    ///         tx.execute(query("UPDATE envios SET pagado = 1 WHERE pedido = $1").bind("P-1"))
    ///             .await?;
    ///         Ok::<_, entrega::StoreError>(())
    ///     })
    ///     .await?;
    /// assert!(matches!(applied, entrega::Processed::Applied(())));
    /// # Ok(()) }
    /// ```
    pub async fn once<T, E>(
        &self,
        consumer: &str,
        key: &str,
        effect: impl AsyncFnOnce(&mut Tx) -> Result<T, E>,
    ) -> Result<Processed<T>, E>
    where
        E: From<StoreError>,
    {
        let mut tx = self.begin().await?;
        if !tx.claim(consumer, key).await? {
            tx.rollback().await?;
            return Ok(Processed::Duplicate);
        }
        // On an error the transaction is dropped, and rolled back, with the claim in it.
        let value = effect(&mut tx).await?;
        tx.commit().await?;
        Ok(Processed::Applied(value))
    }
}

/// What a typed handler does with one event read as `E` (an [`Event`](crate::Event) type,
/// or a [`View`] readable from several versions), inside the transaction the engine opened
/// and in which the message's key is already claimed. Return an error to roll it all back:
/// transient errors are retried, permanent ones dead-lettered.
#[async_trait]
pub trait Apply<E: View>: Send + Sync + 'static {
    /// Applies `event` (read as `E`, upcast if needed) in `tx`; `msg` is the delivery it
    /// came in.
    async fn apply(&self, tx: &mut Tx, event: E, msg: &Message) -> Result<(), HandlerError>;
}

/// A typed route: reads the message as its type and applies it.
#[async_trait]
trait Route: Send + Sync {
    /// The versions the route reads as they are.
    fn versions(&self) -> &'static [u32];

    /// Of the versions one event was published as, the one this route handles.
    fn chosen(&self, upcasters: &Upcasters, listed: &[u32]) -> Option<u32>;

    async fn run(
        &self,
        tx: &mut Tx,
        msg: &Message,
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError>;
}

struct Typed<E, H> {
    handler: H,
    _event: std::marker::PhantomData<fn() -> E>,
}

#[async_trait]
impl<E: View, H: Apply<E>> Route for Typed<E, H> {
    fn versions(&self) -> &'static [u32] {
        E::VERSIONS
    }

    fn chosen(&self, upcasters: &Upcasters, listed: &[u32]) -> Option<u32> {
        transition::chosen_version::<E>(upcasters, listed)
    }

    async fn run(
        &self,
        tx: &mut Tx,
        msg: &Message,
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        let event = upcasters.decode::<E>(&msg.envelope)?;
        self.handler.apply(tx, event, msg).await
    }
}

/// What an [`Idempotent`] consumer has done since it started.
#[derive(Debug, Default)]
pub struct IdempotentStats {
    applied: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    copies: AtomicU64,
}

impl IdempotentStats {
    /// Events applied (effect and key committed).
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// Events whose key was already claimed: skipped without effect.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    /// Attempts that failed and rolled back (retried or dead-lettered by the worker).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Copies of an event published at several versions that were left to the copy this
    /// consumer reads (acknowledged without effect, their key not claimed).
    pub fn copies(&self) -> u64 {
        self.copies.load(Ordering::Relaxed)
    }
}

/// An idempotent consumer: typed handlers by `tipo` (and version), each run in a transaction
/// on `db` that first claims the message's `id_evento` for `consumer`. A key already claimed
/// is a duplicate: acknowledged with no effect. Older versions reach a handler through the
/// [`Upcasters`]; a version with no path, or `datos` that does not fit, is a dead letter of
/// class `esquema`.
#[derive(Clone)]
pub struct Idempotent {
    db: Db,
    consumer: String,
    upcasters: Upcasters,
    /// Handlers by `tipo`, by the version each is written for.
    routes: BTreeMap<String, BTreeMap<u32, Arc<dyn Route>>>,
    ignored: Vec<String>,
    stats: Arc<IdempotentStats>,
}

impl std::fmt::Debug for Idempotent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let routes: Vec<(&String, Vec<&u32>)> = self
            .routes
            .iter()
            .map(|(tipo, versions)| (tipo, versions.keys().collect()))
            .collect();
        f.debug_struct("Idempotent")
            .field("consumer", &self.consumer)
            .field("routes", &routes)
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

impl Idempotent {
    /// A consumer named `consumer` (its rows in `mensajes_procesados.consumidor`) on `db`,
    /// which must hold the inbox tables ([`crate::MigrationSet::Inbox`]).
    pub fn new(db: Db, consumer: impl Into<String>) -> Self {
        Self {
            db,
            consumer: consumer.into(),
            upcasters: Upcasters::new(),
            routes: BTreeMap::new(),
            ignored: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// Brings older versions up to the handlers' through `upcasters`.
    pub fn upcasters(mut self, upcasters: Upcasters) -> Self {
        self.upcasters = upcasters;
        self
    }

    /// Applies events of `E::TIPO` with `handler`. Several handlers of one `tipo` may be
    /// given, for different versions: an event goes to the handler that reads its version
    /// as it is, else to the newest, upcast.
    pub fn on<E: View>(mut self, handler: impl Apply<E>) -> Self {
        let route: Arc<dyn Route> = Arc::new(Typed::<E, _> {
            handler,
            _event: std::marker::PhantomData,
        });
        let newest = E::VERSIONS.iter().copied().max().unwrap_or(1);
        self.routes
            .entry(E::TIPO.to_owned())
            .or_default()
            .insert(newest, route);
        self
    }

    /// Acknowledges events of `tipo` without effect (see [`Router::ignore`]).
    pub fn ignore(mut self, tipo: impl Into<String>) -> Self {
        self.ignored.push(tipo.into());
        self
    }

    /// The consumer's counters, shared with every clone.
    pub fn stats(&self) -> Arc<IdempotentStats> {
        Arc::clone(&self.stats)
    }

    /// The worker's router: every handled `tipo` to this consumer, the ignored ones
    /// acknowledged, anything else dead-lettered as an unknown type.
    pub fn router(self) -> Router {
        let tipos: Vec<String> = self.routes.keys().cloned().collect();
        let ignored = self.ignored.clone();
        let handler: Arc<dyn Handler> = Arc::new(self);
        let router = tipos.into_iter().fold(Router::new(), |router, tipo| {
            router.route(tipo, Arc::clone(&handler))
        });
        ignored.into_iter().fold(router, Router::ignore)
    }

    fn route(&self, msg: &Message) -> Option<&Arc<dyn Route>> {
        let versions = self.routes.get(msg.kind())?;
        let version = msg.envelope.version;
        versions
            .values()
            .find(|route| route.versions().contains(&version))
            .or_else(|| versions.values().next_back())
    }

    /// Whether `msg` is a copy of an event published at several versions (during a
    /// transition) that this consumer leaves to the copy it reads. Decided before the key is
    /// claimed: the copies share their `id_evento`.
    fn left_to_another_copy(&self, msg: &Message) -> bool {
        let listed = transition::listed_versions(msg.headers.get(transition::VERSIONS));
        if listed.len() < 2 {
            return false;
        }
        let Some(routes) = self.routes.get(msg.kind()) else {
            return false;
        };
        routes
            .values()
            .filter_map(|route| route.chosen(&self.upcasters, &listed))
            .max()
            .is_some_and(|chosen| chosen != msg.envelope.version)
    }

    async fn apply(&self, msg: &Message) -> Result<(), HandlerError> {
        if self.left_to_another_copy(msg) {
            self.stats.copies.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let Some(route) = self.route(msg) else {
            return Err(HandlerError::permanent(format!(
                "no handler for `{}` in consumer `{}`",
                msg.kind(),
                self.consumer
            )));
        };
        let upcasters = &self.upcasters;
        let done = self
            .db
            .once(&self.consumer, &msg.id(), async |tx| {
                route.run(tx, msg, upcasters).await
            })
            .await?;
        let counter = match done {
            Processed::Applied(()) => &self.stats.applied,
            Processed::Duplicate => &self.stats.duplicates,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[async_trait]
impl Handler for Idempotent {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let result = self.apply(msg).await;
        if result.is_err() {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}
