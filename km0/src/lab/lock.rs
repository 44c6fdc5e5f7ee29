//! Scenarios: deduplication with a Redis lock, beside the two things that hold (second seed,
//! the comparison table's "Redis Distributed Lock: posible race condition si expira TTL").
//!
//! Two workers of inventario receive the same orders. Worker A handles each one first; for
//! the orders the seed picks it pauses (a long garbage collection, a stalled disk) holding the
//! order's lock, for longer than the lock's TTL, and meanwhile the order is delivered again,
//! to worker B. The naive side deduplicates the way the table describes: a `SET NX PX` lock
//! per message and a "done" key once applied. The lock expires during A's pause, B takes it,
//! and both apply the order. The patterns: the processed-message key in the effect's own
//! transaction (A's open transaction holds B back, and B then finds the key), and the same
//! Redis lock with a fencing token, which the database checks so that a holder whose lock
//! expired can no longer write.

use std::time::Duration;

use anyhow::Context as _;
use entrega::db::{query, Db, Migration};
use entrega::MigrationSet;
use redis::aio::MultiplexedConnection;

use super::embedded::{applied, listed, order_ids, picked, STOCK_MOVES};
use super::{Ledger, Side, SideRun};

/// Orders each side handles.
const ORDERS: usize = 20;
/// Orders whose first worker pauses.
const PAUSED: usize = 3;
/// The lock's time to live.
const TTL: Duration = Duration::from_millis(200);
/// Worker A's pause, with the lock taken: longer than the TTL.
const PAUSE: Duration = Duration::from_millis(500);
/// When the order is delivered again to worker B, after A took it.
const REDELIVERY: Duration = Duration::from_millis(300);
const CONSUMER: &str = "lab.descuento_stock";

/// What stops the second application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fix {
    /// The processed-message key in the effect's transaction.
    KeyInTransaction,
    /// The lock kept, with a fencing token the database checks.
    FencingToken,
}

/// The fencing tokens the database has seen, one per resource.
const FENCES: &[Migration] = &[Migration::same(
    1,
    "the lab's fencing tokens",
    "CREATE TABLE IF NOT EXISTS lab_fences (
         resource TEXT PRIMARY KEY,
         token    INTEGER NOT NULL
     );",
)];

/// Runs one side with its own keys on the lab's Redis, removed after.
pub(super) async fn run(r: &SideRun, fix: Fix) -> anyhow::Result<Ledger> {
    let client = redis::Client::open(r.brokers.redis.as_str())
        .with_context(|| format!("the Redis URL {}", r.brokers.redis))?;
    let redis = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connecting to Redis at {}", r.brokers.redis))?;
    let db = Db::connect(&format!(
        "sqlite://{}",
        r.dir.join("inventario.db").display()
    ))
    .await?;
    let workers = Workers {
        db: db.clone(),
        redis: redis.clone(),
        prefix: r.namespace.clone(),
        side: r.side,
        fix,
    };
    let result = workers
        .run(r.seed)
        .await
        .with_context(|| format!("the {} side", r.side.name()));
    db.close().await;
    let removed = remove_keys(redis, &r.namespace).await;
    let ledger = result?;
    removed?;
    Ok(ledger)
}

/// Deletes every key under `prefix`.
async fn remove_keys(mut redis: MultiplexedConnection, prefix: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut redis)
        .await?;
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await?;
    }
    Ok(())
}

/// Both workers' shared ground: the database, Redis, and what the side does.
struct Workers {
    db: Db,
    redis: MultiplexedConnection,
    prefix: String,
    side: Side,
    fix: Fix,
}

/// How one worker's handling of one order ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    Applied,
    /// Seen as done (or locked by the other worker): skipped.
    Skipped,
    /// Its fencing token was older than one the database had seen: refused.
    Fenced,
}

impl Workers {
    async fn run(&self, seed: u64) -> anyhow::Result<Ledger> {
        self.db.migrate(&[MigrationSet::Inbox]).await?;
        self.db.apply_migrations("lab", STOCK_MOVES).await?;
        self.db.apply_migrations("lab_fences", FENCES).await?;
        let orders = order_ids(ORDERS);
        let paused = picked(seed, &orders, PAUSED);
        let mut fenced = 0;
        for order in &orders {
            if paused.contains(order) {
                let a = self.handle("A", order, Some(PAUSE));
                let b = async {
                    tokio::time::sleep(REDELIVERY).await;
                    self.handle("B", order, None).await
                };
                let (a, b) = tokio::join!(a, b);
                fenced += [a?, b?].iter().filter(|h| **h == Handled::Fenced).count();
            } else {
                self.handle("A", order, None).await?;
            }
        }
        let mut ledger =
            Ledger::from_effects(&orders, &applied(&self.db, "lab_stock_moves").await?);
        ledger.fault = format!(
            "worker A paused {} ms holding the lock ({} ms TTL) on orders {}; each was \
             delivered again to worker B {} ms in{}",
            PAUSE.as_millis(),
            TTL.as_millis(),
            listed(&paused),
            REDELIVERY.as_millis(),
            if fenced > 0 {
                format!("; a stale token refused {fenced} times")
            } else {
                String::new()
            }
        );
        Ok(ledger)
    }

    /// One worker handles `order`, pausing `pause` once it holds what it holds.
    async fn handle(
        &self,
        worker: &str,
        order: &str,
        pause: Option<Duration>,
    ) -> anyhow::Result<Handled> {
        match (self.side, self.fix) {
            (Side::Pattern, Fix::KeyInTransaction) => self.in_transaction(order, pause).await,
            (Side::Naive, _) => self.with_lock(worker, order, pause, false).await,
            (Side::Pattern, Fix::FencingToken) => self.with_lock(worker, order, pause, true).await,
        }
    }

    /// The key and the effect in one transaction: a second worker waits for the first's
    /// commit, then finds the key.
    async fn in_transaction(
        &self,
        order: &str,
        pause: Option<Duration>,
    ) -> anyhow::Result<Handled> {
        let mut tx = self.db.begin().await?;
        let first = tx.claim(CONSUMER, order).await?;
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        if first {
            tx.execute(query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(order))
                .await?;
        }
        tx.commit().await?;
        Ok(if first {
            Handled::Applied
        } else {
            Handled::Skipped
        })
    }

    /// Deduplication with a Redis lock (`SET NX PX`) and a "done" key, with or without a
    /// fencing token checked by the database.
    async fn with_lock(
        &self,
        worker: &str,
        order: &str,
        pause: Option<Duration>,
        fencing: bool,
    ) -> anyhow::Result<Handled> {
        let mut redis = self.redis.clone();
        let (lock, done, fence) = (
            format!("{}lock:{order}", self.prefix),
            format!("{}done:{order}", self.prefix),
            format!("{}fence:{order}", self.prefix),
        );
        let seen: Option<String> = redis::cmd("GET").arg(&done).query_async(&mut redis).await?;
        if seen.is_some() {
            return Ok(Handled::Skipped);
        }
        let taken: Option<String> = redis::cmd("SET")
            .arg(&lock)
            .arg(worker)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut redis)
            .await?;
        if taken.is_none() {
            return Ok(Handled::Skipped);
        }
        let token: i64 = if fencing {
            redis::cmd("INCR")
                .arg(&fence)
                .query_async(&mut redis)
                .await?
        } else {
            0
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let mut tx = self.db.begin().await?;
        if fencing {
            // The database keeps the newest token per order and refuses an older one.
            let newer = tx
                .execute(
                    query(
                        "INSERT INTO lab_fences (resource, token) VALUES ($1, $2)
                         ON CONFLICT (resource) DO UPDATE SET token = excluded.token
                         WHERE excluded.token > lab_fences.token",
                    )
                    .bind(order)
                    .bind(token),
                )
                .await?;
            if newer == 0 {
                drop(tx);
                return Ok(Handled::Fenced);
            }
        }
        tx.execute(query("INSERT INTO lab_stock_moves (order_id) VALUES ($1)").bind(order))
            .await?;
        tx.commit().await?;
        let _: () = redis::cmd("SET")
            .arg(&done)
            .arg(worker)
            .query_async(&mut redis)
            .await?;
        // Gives the lock back only if it is still this worker's.
        let holder: Option<String> = redis::cmd("GET").arg(&lock).query_async(&mut redis).await?;
        if holder.as_deref() == Some(worker) {
            let _: i64 = redis::cmd("DEL").arg(&lock).query_async(&mut redis).await?;
        }
        Ok(Handled::Applied)
    }
}
