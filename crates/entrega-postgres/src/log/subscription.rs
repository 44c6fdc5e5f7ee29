//! One member's consumer-group session on a topic.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Record, Subscriber, Subscription, TransportError};
use tokio::sync::watch;

use super::group::{self, HeldPartition, Member};
use super::{record_of, PgLog};
use super::{slots_i32, ttl_ms};
use crate::errors::transport;

/// Reads the next records of every readable held partition with one statement. Rows are
/// interleaved across partitions by distance from each read position, so one busy partition
/// cannot starve the others; within a partition they stay in offset order.
const FETCH: &str = "
SELECT r.partition_no, r.log_offset, r.msg_key, r.headers, r.payload, r.appended_at_ms
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
struct Held {
    token: i64,
    /// Next offset to read.
    position: i64,
    /// Clock time (ms) before which the partition yields nothing.
    paused_until_ms: Option<i64>,
}

/// A member of a consumer group on one topic of a [`PgLog`].
#[derive(Debug)]
pub struct PgSubscription {
    log: PgLog,
    group: String,
    topic: String,
    member: String,
    held: BTreeMap<u32, Held>,
    last_balance_ms: Option<i64>,
    wake: watch::Receiver<u64>,
    closed: bool,
}

impl PgSubscription {
    fn who(&self) -> Member<'_> {
        Member {
            group: &self.group,
            topic: &self.topic,
            member: &self.member,
        }
    }

    fn balance_due(&self, now_ms: i64) -> bool {
        let every = ttl_ms(self.log.config.heartbeat);
        self.last_balance_ms
            .is_none_or(|last| now_ms - last >= every)
    }

    async fn rebalance(&mut self, now_ms: i64) -> Result<(), TransportError> {
        let ttl = ttl_ms(self.log.config.lease_ttl);
        let held = group::balance(&self.log.pool, &self.who(), now_ms, ttl).await?;
        let mut next = BTreeMap::new();
        for HeldPartition {
            partition,
            token,
            committed,
        } in held
        {
            let state = match self.held.get(&partition) {
                // Same holding as before: keep the read position (it may be past the commit).
                Some(h) if h.token == token => *h,
                // Newly acquired (or re-acquired after losing it): resume from the commit.
                _ => Held {
                    token,
                    position: committed.unwrap_or(0),
                    paused_until_ms: None,
                },
            };
            next.insert(partition, state);
        }
        self.held = next;
        self.last_balance_ms = Some(now_ms);
        Ok(())
    }

    async fn fetch(&mut self, max: usize, now_ms: i64) -> Result<Vec<Record>, TransportError> {
        let readable: Vec<(u32, i64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.paused_until_ms.is_none_or(|t| t <= now_ms))
            .map(|(p, h)| (*p, h.position))
            .collect();
        if readable.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        let partitions: Vec<u32> = readable.iter().map(|(p, _)| *p).collect();
        let positions: Vec<i64> = readable.iter().map(|(_, o)| *o).collect();
        let rows = sqlx::query(FETCH)
            .bind(&self.topic)
            .bind(slots_i32(&partitions))
            .bind(&positions)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&self.log.pool)
            .await
            .map_err(transport)?;
        let mut records = Vec::with_capacity(rows.len());
        for row in &rows {
            let record = record_of(&self.topic, row)?;
            if let Some(h) = self.held.get_mut(&record.partition) {
                h.position = h.position.max(record.offset + 1);
            }
            records.push(record);
        }
        Ok(records)
    }

    fn any_paused(&self, now_ms: i64) -> bool {
        self.held
            .values()
            .any(|h| h.paused_until_ms.is_some_and(|t| t > now_ms))
    }
}

#[async_trait]
impl Subscription for PgSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        if self.closed {
            return Err(TransportError::Rejected {
                reason: "the subscription is closed".to_owned(),
            });
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let now = self.log.clock.now_ms();
            if self.balance_due(now) {
                self.rebalance(now).await?;
            }
            // Mark notifications seen *before* reading, so an append committed after the
            // read still wakes the wait below.
            self.wake.borrow_and_update();
            let records = self.fetch(max, now).await?;
            if !records.is_empty() || max == 0 {
                return Ok(records);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(records);
            }
            let config = &self.log.config;
            // Wake in time to heartbeat, and to notice paused partitions coming back.
            let mut limit = left.min(config.heartbeat.max(Duration::from_millis(1)));
            if self.any_paused(now) {
                limit = limit.min(config.poll_interval);
            }
            self.log
                .listener
                .wait(&mut self.wake, limit, config.poll_interval)
                .await;
        }
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        // The last offset given for a partition wins.
        let mut wanted: BTreeMap<u32, i64> = BTreeMap::new();
        for (p, o) in offsets {
            wanted.insert(*p, *o);
        }
        let mut fenced = Vec::with_capacity(wanted.len());
        for (p, o) in &wanted {
            match self.held.get(p) {
                Some(h) => fenced.push((*p, *o, h.token)),
                None => {
                    return Err(TransportError::NotAssigned {
                        topic: self.topic.clone(),
                        partition: *p,
                    })
                }
            }
        }
        if fenced.is_empty() {
            return Ok(());
        }
        let now = self.log.clock.now_ms();
        let lost = group::commit_offsets(&self.log.pool, &self.who(), &fenced, now).await?;
        match lost {
            None => Ok(()),
            Some(p) => {
                // Someone else holds it now: stop reading it until a rebalance gives it back.
                self.held.remove(&p);
                Err(TransportError::NotAssigned {
                    topic: self.topic.clone(),
                    partition: p,
                })
            }
        }
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        if let Some(h) = self.held.get_mut(&partition) {
            h.position = offset.max(0);
        }
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        let until_ms = self.log.clock.now_ms().saturating_add(ttl_ms(until));
        if let Some(h) = self.held.get_mut(&partition) {
            h.paused_until_ms = Some(until_ms);
        }
    }

    fn assignment(&self) -> Vec<u32> {
        self.held.keys().copied().collect()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        if self.closed {
            return Ok(());
        }
        group::leave(&self.log.pool, &self.who()).await?;
        self.held.clear();
        self.closed = true;
        Ok(())
    }
}

#[async_trait]
impl Subscriber for PgLog {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.require_topic(topic).await?;
        let wake = self.listener.subscribe(topic);
        // Connect the listener now, so the first idle poll already has notifications.
        self.listener.start();
        let who = Member {
            group,
            topic,
            member,
        };
        let mut conn = self.pool.acquire().await.map_err(transport)?;
        group::join(&mut conn, &who, self.clock.now_ms()).await?;
        Ok(Box::new(PgSubscription {
            log: self.clone(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            member: member.to_owned(),
            held: BTreeMap::new(),
            last_balance_ms: None,
            wake,
            closed: false,
        }))
    }
}
