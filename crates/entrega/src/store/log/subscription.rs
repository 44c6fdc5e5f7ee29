//! One member's session in a consumer group: balanced partitions, read positions kept in
//! memory, pauses, fenced commits, and waits woken by appends.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Holder, Record, Subscriber, Subscription, TransportError};
use entrega_postgres::Listener;
use entrega_sqlite::CommitWaiter;
use tokio::sync::watch;
use tokio::time::Instant;

use super::admin::{record, RecordRow};
use super::group::{self, Held, Member};
use super::{ms, Appends, DbLog};
use crate::db::Pool;
use crate::store::int4;

/// PostgreSQL: the next records of every readable held partition in one statement,
/// interleaved across partitions by distance from each read position, so one busy partition
/// cannot starve the others; within a partition they stay in offset order.
const POSTGRES_FETCH: &str = "
SELECT CAST(r.partition_no AS BIGINT), r.log_offset, r.msg_key, r.headers, r.payload,
       r.appended_at_ms
FROM UNNEST($2::int4[], $3::int8[]) AS c(p, o)
CROSS JOIN LATERAL (
    SELECT l.partition_no, l.log_offset, l.msg_key, l.headers, l.payload, l.appended_at_ms,
           l.log_offset - c.o AS distance
    FROM entrega_log l
    WHERE l.topic = $1 AND l.partition_no = c.p AND l.log_offset >= c.o
    ORDER BY l.log_offset
    LIMIT $4
) r
ORDER BY r.distance, r.partition_no
LIMIT $4";

/// A partition this member holds.
#[derive(Debug, Clone, Copy)]
struct Assigned {
    /// Fencing token of the lease; commits carry it.
    token: i64,
    /// Next offset to return from `poll`.
    position: i64,
    /// Held back until then: on the timer (so a paused tokio runtime drives it) and on the
    /// log's clock, whichever comes first.
    paused: Option<(Instant, i64)>,
}

impl Assigned {
    fn paused_at(&self, now: Instant, now_ms: i64) -> bool {
        self.paused
            .is_some_and(|(until, until_ms)| until > now && until_ms > now_ms)
    }
}

/// How an idle poll learns of appends.
#[derive(Debug)]
enum Wake {
    /// Commits of this process, from SQLite's commit hooks.
    Sqlite(CommitWaiter),
    /// PostgreSQL's notifications for the topic.
    Postgres(Listener, watch::Receiver<u64>),
}

/// A group member on the log in a database.
#[derive(Debug)]
struct DbSubscription {
    log: DbLog,
    group: String,
    topic: String,
    /// The member's name and this subscription's life of it: a member that subscribes again
    /// under its name (a restarted process) takes its earlier life's partitions at once.
    member: Holder,
    assigned: BTreeMap<u32, Assigned>,
    /// Clock time of the last heartbeat-and-balance, if any.
    last_balance_ms: Option<i64>,
    /// Partition to serve first on the next SQLite read, so a busy one cannot starve others.
    next_first: u32,
    wake: Wake,
    closed: bool,
}

impl DbSubscription {
    fn who(&self) -> Member<'_> {
        Member {
            group: &self.group,
            topic: &self.topic,
            member: &self.member,
        }
    }

    /// Heartbeats and rebalances if a heartbeat period has passed since the last time (or
    /// the clock went backwards).
    async fn maybe_balance(&mut self, now: i64) -> Result<(), TransportError> {
        let due = self.last_balance_ms.is_none_or(|last| {
            now.saturating_sub(last) >= ms(self.log.config.heartbeat) || now < last
        });
        if !due {
            return Ok(());
        }
        let ttl = ms(self.log.config.lease_ttl);
        let held = group::balance(&self.log.db, self.who(), now, ttl).await?;
        let mut assigned = BTreeMap::new();
        for Held {
            partition,
            token,
            committed,
        } in held
        {
            let state = match self.assigned.get(&partition) {
                // Held without interruption: keep the read position (it may be past the
                // commit).
                Some(a) if a.token == token => *a,
                // Newly acquired (or back after losing it): resume from the commit.
                _ => Assigned {
                    token,
                    position: committed.unwrap_or(0),
                    paused: None,
                },
            };
            assigned.insert(partition, state);
        }
        self.assigned = assigned;
        self.last_balance_ms = Some(now);
        Ok(())
    }

    /// The held partitions not paused, with their read positions, the one to serve first
    /// first.
    fn readable(&self, now_ms: i64) -> Vec<(u32, i64)> {
        let now = Instant::now();
        let mut readable: Vec<(u32, i64)> = self
            .assigned
            .iter()
            .filter(|(_, a)| !a.paused_at(now, now_ms))
            .map(|(p, a)| (*p, a.position))
            .collect();
        let split = readable.partition_point(|(p, _)| *p < self.next_first);
        readable.rotate_left(split);
        readable
    }

    /// Reads up to `max` records from held, unpaused partitions and advances their positions.
    async fn fetch(&mut self, max: usize, now_ms: i64) -> Result<Vec<Record>, TransportError> {
        let readable = self.readable(now_ms);
        if readable.is_empty() {
            return Ok(Vec::new());
        }
        let records = match &self.log.db.pool {
            Pool::Postgres(pool) => {
                let partitions: Vec<i32> = readable.iter().map(|(p, _)| int4(*p)).collect();
                let positions: Vec<i64> = readable.iter().map(|(_, o)| *o).collect();
                let rows: Vec<RecordRow> = sqlx::query_as(POSTGRES_FETCH)
                    .bind(&self.topic)
                    .bind(&partitions)
                    .bind(&positions)
                    .bind(i64::try_from(max).unwrap_or(i64::MAX))
                    .fetch_all(pool)
                    .await
                    .map_err(entrega_postgres::classify)?;
                rows.into_iter()
                    .map(|row| record(&self.topic, row))
                    .collect::<Result<Vec<_>, _>>()?
            }
            // No LATERAL: partition by partition, each an index range.
            Pool::Sqlite(_) => {
                let mut out = Vec::new();
                for (partition, from) in readable {
                    if out.len() >= max {
                        break;
                    }
                    let records = self
                        .log
                        .read(&self.topic, partition, from, max - out.len())
                        .await?;
                    if !records.is_empty() {
                        self.next_first = partition + 1;
                    }
                    out.extend(records);
                }
                out
            }
        };
        for r in &records {
            if let Some(a) = self.assigned.get_mut(&r.partition) {
                a.position = a.position.max(r.offset + 1);
            }
        }
        Ok(records)
    }

    fn any_paused(&self, now_ms: i64) -> bool {
        let now = Instant::now();
        self.assigned.values().any(|a| a.paused_at(now, now_ms))
    }

    /// Counts every append signalled so far as seen, before reading.
    fn mark_seen(&mut self) {
        match &mut self.wake {
            Wake::Sqlite(waiter) => waiter.mark(),
            Wake::Postgres(_, rx) => {
                rx.borrow_and_update();
            }
        }
    }

    /// Waits for an append, at most `limit`; where appends are not signalled (other processes
    /// on SQLite, a lost notification connection on PostgreSQL) at most the poll interval.
    async fn wait(&mut self, limit: Duration) {
        let fallback = self.log.config.poll_interval;
        match &mut self.wake {
            Wake::Postgres(listener, rx) => {
                listener.wait(rx, limit, fallback).await;
            }
            Wake::Sqlite(waiter) => {
                waiter.wait(limit.min(fallback)).await;
            }
        }
    }
}

#[async_trait]
impl Subscription for DbSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        if self.closed {
            return Err(TransportError::Rejected {
                reason: format!(
                    "subscription of `{}` to `{}` is closed",
                    self.member.name, self.topic
                ),
            });
        }
        let deadline = Instant::now() + wait;
        let max = max.max(1);
        loop {
            let now = self.log.clock.now_ms();
            self.maybe_balance(now).await?;
            // Taken before reading, so an append that lands after the read still wakes us.
            self.mark_seen();
            let records = self.fetch(max, now).await?;
            if !records.is_empty() {
                return Ok(records);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(records);
            }
            let config = &self.log.config;
            // Wake in time to heartbeat, and to notice paused partitions coming back.
            let mut limit = left.min(config.heartbeat.max(Duration::from_millis(1)));
            if self.any_paused(now) {
                limit = limit.min(config.poll_interval);
            }
            self.wait(limit).await;
        }
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        // The last offset given for a partition wins.
        let mut wanted: BTreeMap<u32, i64> = BTreeMap::new();
        for (p, o) in offsets {
            wanted.insert(*p, *o);
        }
        let mut fenced = Vec::with_capacity(wanted.len());
        for (partition, next_offset) in wanted {
            let Some(a) = self.assigned.get(&partition) else {
                return Err(TransportError::NotAssigned {
                    topic: self.topic.clone(),
                    partition,
                });
            };
            fenced.push((partition, next_offset, a.token));
        }
        if fenced.is_empty() {
            return Ok(());
        }
        let now = self.log.clock.now_ms();
        match group::commit(&self.log.db, self.who(), &fenced, now).await? {
            None => Ok(()),
            Some(partition) => {
                // Someone else holds it now: stop reading it until a balance gives it back.
                self.assigned.remove(&partition);
                Err(TransportError::NotAssigned {
                    topic: self.topic.clone(),
                    partition,
                })
            }
        }
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        if let Some(a) = self.assigned.get_mut(&partition) {
            a.position = offset.max(0);
        }
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        let now = Instant::now();
        // An absurd pause still pauses, for as long as the timer can express.
        let timer = now
            .checked_add(until)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)));
        let clock = self.log.clock.now_ms().saturating_add(ms(until));
        if let (Some(a), Some(timer)) = (self.assigned.get_mut(&partition), timer) {
            a.paused = Some((timer, clock));
        }
    }

    fn assignment(&self) -> Vec<u32> {
        self.assigned.keys().copied().collect()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        if self.closed {
            return Ok(());
        }
        group::leave(&self.log.db, self.who()).await?;
        self.assigned.clear();
        self.closed = true;
        Ok(())
    }
}

#[async_trait]
impl Subscriber for DbLog {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.require_topic(topic).await?;
        let wake = match &self.appends {
            Appends::Notified(listener) => {
                let rx = listener.subscribe(topic);
                // Connect the listener now, so the first idle poll already has notifications.
                listener.start();
                Wake::Postgres(listener.clone(), rx)
            }
            // Its own position, counting what came before as seen.
            Appends::Signalled(appended) => {
                let waiter = CommitWaiter::clone(appended);
                waiter.mark();
                Wake::Sqlite(waiter)
            }
        };
        // Only announce the member here; partitions are taken on the first poll, so members
        // that start together split the topic at once instead of the first taking it all.
        let now = self.clock.now_ms();
        let holder = Holder::new(member, now);
        let who = Member {
            group,
            topic,
            member: &holder,
        };
        group::join(&self.db, who, now).await?;
        Ok(Box::new(DbSubscription {
            log: self.clone(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            member: holder,
            assigned: BTreeMap::new(),
            last_balance_ms: None,
            next_first: 0,
            wake,
            closed: false,
        }))
    }
}
