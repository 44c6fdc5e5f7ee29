//! One replication session: read the stream, publish in stream order, hand confirmed batches
//! to the marker, and report the positions it completed.
//!
//! At most one publish is in flight, so rows reach the broker in stream order. While it waits
//! for the broker, the stream is read into the next batch (up to the batch size); when the
//! broker is quick, each batch is whatever arrived meanwhile, so a lone row goes out at once.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use entrega_core::{OutboxRow, OutgoingMessage, TransportError};
use entrega_postgres::wal::pgoutput::{Change, Decoder};
use entrega_postgres::wal::replication::{
    Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent,
};
use entrega_postgres::wal::{current_replication_config, slot, OutboxColumns};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::marker::{Confirmed, Marker};
use super::prepare::{store, Plan};
use super::{publish, WalError, WalRelay};
use crate::relay_config::millis;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// How a session ended, when not by a shutdown.
#[derive(Debug)]
pub(super) enum End {
    /// An operator is needed.
    Fatal(WalError),
    /// The slot was created and caught up; the next session streams.
    Created,
    /// Another session streams from the slot (its process id; 0 when unknown).
    SlotBusy(i32),
    /// The database, the broker or the stream failed for now; try again after a backoff.
    Transient(String),
    /// The stream ended after it ran (the server restarted, the connection was cut).
    Streamed,
}

/// A replication protocol failure: an object in use means another session holds the slot;
/// anything else is retried (a missing slot is then found by the next plan).
pub(super) fn stream_error(e: PgWireError) -> End {
    let text = e.to_string();
    if text.contains("is active for PID") || text.contains("55006") {
        let pid = text
            .rsplit(' ')
            .next()
            .and_then(|p| p.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
            .unwrap_or(0);
        return End::SlotBusy(pid);
    }
    End::Transient(text)
}

/// The publish in flight: its task and what it carries.
struct InFlight {
    task: JoinHandle<Result<(), TransportError>>,
    confirmed: Confirmed,
}

impl Drop for InFlight {
    /// A publish left behind by a session that ended is stopped: the next session publishes
    /// the same rows again, and two publishes of them must not run at once.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What was read from the stream and not yet handed to a publish.
#[derive(Default)]
struct Reading {
    decoder: Decoder,
    /// Outbox column positions by relation id.
    columns: HashMap<u32, OutboxColumns>,
    rows: Vec<OutboxRow>,
    upto: Option<u64>,
    /// Transaction ends read but not yet confirmed, with their commit times (Unix ms).
    commits: VecDeque<(u64, i64)>,
    /// Between a transaction's begin and its commit.
    in_transaction: bool,
}

impl WalRelay {
    /// Runs one session as `plan` says: `Ok` after a shutdown, else why it ended.
    pub(super) async fn session(
        &self,
        name: &str,
        plan: Plan,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        match plan {
            Plan::Create { recreate } => {
                self.create(name, recreate, shutdown).await?;
                Err(End::Created)
            }
            Plan::Stream => self.stream(name, shutdown).await,
        }
    }

    /// The settings of a replication session on slot `name`, on the server taking writes
    /// now (both sessions, the stream and a snapshot's, ask each time: a failover moves it).
    pub(super) async fn replication_config(&self, name: &str) -> Result<ReplicationConfig, End> {
        current_replication_config(&self.url, name, slot::PUBLICATION, self.wal.status_interval)
            .await
            .map_err(store)
    }

    async fn stream(&self, name: &str, shutdown: &CancellationToken) -> Result<(), End> {
        let config = self
            .replication_config(name)
            .await?
            .with_binary(self.wal.binary);
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(stream_error)?;
        client.wait_started().await.map_err(stream_error)?;
        tracing::info!(slot = name, "WAL relay streaming");
        self.gauges.set_streaming(true);
        let (jobs, queue) = mpsc::channel(64);
        let (marked_tx, mut marked) = watch::channel(0u64);
        let marker = tokio::spawn(
            Marker {
                pool: self.pool.clone(),
                stats: Arc::clone(&self.stats),
                backoff: self.config.backoff,
                jobs: queue,
                marked: marked_tx,
                every: self.wal.mark_every,
            }
            .run(),
        );
        let result = self.pump(&mut client, &jobs, &mut marked, shutdown).await;
        self.gauges.set_streaming(false);
        drop(jobs);
        let marked_all = marker.await;
        // What the marker completed is reported before the session closes; after a shutdown
        // the relay waits (briefly) for the server to have it, so the next one starts there.
        let upto = *marked.borrow();
        client.update_applied_lsn(Lsn(upto));
        if result.is_ok() && upto > 0 {
            self.await_confirmed(name, upto).await;
        }
        client.stop();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
        match marked_all {
            Ok(Ok(())) => {}
            Ok(Err(failed)) => return Err(store(failed.0)),
            Err(e) => return Err(End::Transient(format!("the marker task failed: {e}"))),
        }
        result
    }

    /// Waits until the server shows the slot confirmed at `upto` or later, for at most a few
    /// status intervals.
    async fn await_confirmed(&self, name: &str, upto: u64) {
        let deadline =
            tokio::time::Instant::now() + self.wal.status_interval * 3 + Duration::from_secs(1);
        while tokio::time::Instant::now() < deadline {
            let confirmed: Result<Option<i64>, _> = sqlx::query_scalar(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots \
                 WHERE slot_name = $1",
            )
            .bind(name)
            .fetch_one(&self.pool)
            .await;
            match confirmed {
                Ok(Some(at)) if u64::try_from(at).unwrap_or(0) >= upto => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(_) => return,
            }
        }
    }

    /// The session's loop; returns after a shutdown (the batch in flight settled) or when the
    /// stream ends.
    async fn pump(
        &self,
        client: &mut ReplicationClient,
        jobs: &mpsc::Sender<Confirmed>,
        marked: &mut watch::Receiver<u64>,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let mut reading = Reading::default();
        let mut in_flight: Option<InFlight> = None;
        let mut heartbeat =
            tokio::time::interval(self.wal.heartbeat_interval.max(Duration::from_millis(1)));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut purged_at: Option<tokio::time::Instant> = None;
        let mut draining = false;
        loop {
            if in_flight.is_none() {
                in_flight = self.start_publish(&mut reading, jobs).await?;
            }
            if draining && in_flight.is_none() {
                return Ok(());
            }
            let room = reading.rows.len() < self.wal.max_batch.max(1);
            tokio::select! {
                biased;
                () = shutdown.cancelled(), if !draining => draining = true,
                changed = marked.changed() => {
                    if changed.is_err() {
                        return Err(End::Transient("the marker stopped".into()));
                    }
                    let upto = *marked.borrow_and_update();
                    client.update_applied_lsn(Lsn(upto));
                    while reading.commits.front().is_some_and(|(lsn, _)| *lsn <= upto) {
                        reading.commits.pop_front();
                    }
                    self.gauges.set_oldest_unconfirmed(reading.commits.front().map(|(_, at)| *at));
                }
                done = async { (&mut in_flight.as_mut().map(|f| &mut f.task)?).await.ok() }, if in_flight.is_some() => {
                    let Some(mut flight) = in_flight.take() else { continue };
                    match done {
                        Some(Ok(())) => {
                            if jobs.send(std::mem::take(&mut flight.confirmed)).await.is_err() {
                                return Err(End::Transient("the marker stopped".into()));
                            }
                        }
                        failed => {
                            let why = match failed {
                                Some(Err(e)) => e.to_string(),
                                _ => "the publish task failed".into(),
                            };
                            if draining {
                                // Unpublished rows stay unconfirmed: the next session reads them again.
                                return Ok(());
                            }
                            // The session ends rather than hold the slot while the broker is
                            // away: a server shutting down waits for its logical senders' last
                            // position to be confirmed, which an unpublished batch never is.
                            // The next session reads the batch again from the last confirmed
                            // position, after the backoff.
                            return Err(End::Transient(format!(
                                "publishing {} rows: {why}",
                                flight.confirmed.ids.len()
                            )));
                        }
                    }
                }
                event = client.recv(), if room && !draining => {
                    match event {
                        Ok(Some(event)) => self.read(&mut reading, event)?,
                        Ok(None) => return Err(End::Streamed),
                        Err(e) => return Err(match stream_error(e) {
                            End::Transient(why) => End::Transient(format!("replication stream: {why}")),
                            other => other,
                        }),
                    }
                }
                _ = heartbeat.tick() => {
                    let pool = self.pool.clone();
                    tokio::spawn(async move {
                        if let Err(e) = slot::emit_heartbeat(&pool).await {
                            tracing::debug!(error = %e, "writing the WAL heartbeat failed");
                        }
                    });
                }
                _ = tick.tick() => {
                    // Kept across sessions: what a failed session read stays unconfirmed.
                    if let Some((_, at)) = reading.commits.front() {
                        self.gauges.set_oldest_unconfirmed(Some(*at));
                    }
                    let due = purged_at.is_none_or(|at| at.elapsed() >= self.config.purge_interval);
                    if due {
                        purged_at = Some(tokio::time::Instant::now());
                        self.spawn_purge();
                    }
                }
            }
        }
    }

    /// Starts publishing what was read, if anything: a batch of rows, or only a position to
    /// confirm (a transaction with no outbox rows, a heartbeat) handed straight to the marker.
    async fn start_publish(
        &self,
        reading: &mut Reading,
        jobs: &mpsc::Sender<Confirmed>,
    ) -> Result<Option<InFlight>, End> {
        if reading.rows.is_empty() {
            if let Some(upto) = reading.upto.take() {
                let only = Confirmed {
                    ids: Vec::new(),
                    upto: Some(upto),
                };
                if jobs.send(only).await.is_err() {
                    return Err(End::Transient("the marker stopped".into()));
                }
            }
            return Ok(None);
        }
        let rows = std::mem::take(&mut reading.rows);
        let messages = Arc::new(publish::messages(&self.config, &rows).map_err(|e| {
            // A row nothing routes: the stream stops here, and the slot with it, until the
            // routing is fixed; nothing after it is skipped.
            End::Fatal(WalError::Stream(format!(
                "an outbox row cannot be published: {e}"
            )))
        })?);
        Ok(Some(InFlight {
            task: self.spawn_publish(messages),
            confirmed: Confirmed {
                ids: rows.iter().map(|r| r.id).collect(),
                upto: reading.upto.take(),
            },
        }))
    }

    fn spawn_publish(
        &self,
        messages: Arc<Vec<OutgoingMessage>>,
    ) -> JoinHandle<Result<(), TransportError>> {
        let publisher = Arc::clone(&self.publisher);
        let stats = Arc::clone(&self.stats);
        tokio::spawn(publish::publish(publisher, stats, messages))
    }

    /// Deletes published rows past retention, in the background.
    fn spawn_purge(&self) {
        let maintenance = self.db.outbox().maintenance;
        let before = entrega_core::now_ms().saturating_sub(millis(self.config.retention));
        let stats = Arc::clone(&self.stats);
        tokio::spawn(async move {
            match maintenance.purge_published(before).await {
                Ok(n) => crate::relay_config::bump(&stats.purged, n),
                Err(e) => tracing::warn!(error = %e, "purging published outbox rows failed"),
            }
        });
    }

    /// Takes one event of the stream into `reading`.
    fn read(&self, reading: &mut Reading, event: ReplicationEvent) -> Result<(), End> {
        match event {
            ReplicationEvent::XLogData { data, .. } => {
                let change = reading
                    .decoder
                    .decode(&data)
                    .map_err(|e| End::Fatal(WalError::Stream(e.to_string())))?;
                match change {
                    Change::Relation(relation) => {
                        let columns = OutboxColumns::of(&relation)
                            .map_err(|e| End::Fatal(WalError::Stream(e.to_string())))?;
                        reading.columns.insert(relation.id, columns);
                    }
                    Change::Insert { relation, values } => {
                        let columns = reading.columns.get(&relation).ok_or_else(|| {
                            End::Fatal(WalError::Stream(format!(
                                "an insert into relation {relation}, which is not the outbox"
                            )))
                        })?;
                        let row = columns
                            .row(&values)
                            .map_err(|e| End::Fatal(WalError::Stream(e.to_string())))?;
                        reading.rows.extend(row);
                    }
                    Change::Other(_) => {}
                }
            }
            ReplicationEvent::Begin { .. } => reading.in_transaction = true,
            ReplicationEvent::Commit {
                end_lsn,
                commit_time_micros,
                ..
            } => {
                reading.in_transaction = false;
                reading.upto = Some(end_lsn.as_u64());
                let unix_ms = (commit_time_micros + PG_EPOCH_MICROS) / 1000;
                if reading.commits.is_empty() {
                    // The first transaction a session reads is the oldest not confirmed.
                    self.gauges.set_oldest_unconfirmed(Some(unix_ms));
                }
                reading.commits.push_back((end_lsn.as_u64(), unix_ms));
            }
            ReplicationEvent::Message { prefix, lsn, .. } if prefix == slot::HEARTBEAT_PREFIX => {
                // Everything before the heartbeat was read: its position is whole.
                let at = lsn.as_u64();
                reading.upto = Some(reading.upto.map_or(at, |u| u.max(at)));
            }
            // Everything the server sent before a keepalive was read: between transactions,
            // its position is whole too. Confirming it lets a server shutting down see its
            // last WAL confirmed (a logical walsender waits for that before it exits).
            ReplicationEvent::KeepAlive { wal_end, .. } if !reading.in_transaction => {
                let at = wal_end.as_u64();
                if at > reading.upto.unwrap_or(0) {
                    reading.upto = Some(at);
                }
            }
            _ => {}
        }
        Ok(())
    }
}
