//! What km0's components share when they start: consumer workers with the process's retry
//! policy (`--retry`), the relays' poll, the purge of old processed-message keys, and
//! serving an HTTP API.

use std::time::Duration;

use anyhow::Context as _;
use entrega::{CancellationToken, Db, Router, Worker, WorkerConfig};

use super::component::Database;
use super::config::RetryMode;
use super::relay::{RelaySource, ServiceRelay};
use super::{Broker, Start, System, Task};
use crate::services::pedidos::PARTITIONS;

/// Longest wait of an idle relay for rows committed by other processes (the seed's 0.2 s).
pub const RELAY_POLL: Duration = Duration::from_millis(200);

/// A worker for `group` on `topic` as `member`, with the process's key concurrency and retry
/// policy; ordered retries park in `db`, the consumer's own database; on RabbitMQ, dead
/// letters and delayed retries use the group's own queues.
pub fn consumer_worker(
    system: &System,
    broker: &Broker,
    router: Router,
    names: (&str, &str, String),
    db: &Db,
) -> Worker {
    consumer_worker_keyed(system, broker, router, names, db, system.key_concurrency())
}

/// [`consumer_worker`] running up to `key_concurrency` keys of a poll at once (one key
/// never runs twice at once, and always in order).
pub fn consumer_worker_keyed(
    system: &System,
    broker: &Broker,
    router: Router,
    (group, topic, member): (&str, &str, String),
    db: &Db,
    key_concurrency: usize,
) -> Worker {
    let mut config = WorkerConfig::new(group, topic).with_key_concurrency(key_concurrency);
    config.member = member;
    config.max_batch = system.max_batch();
    config.replay_key = system.replay_key().cloned();
    system.retry().apply(&mut config);
    config.retry_partitions = PARTITIONS;
    // A dead letter the broker refuses is held in the consumer's own database.
    let mut worker = Worker::new(broker.subscriber(), broker.publisher(), router, config)
        .with_admin(broker.admin())
        .with_held_letters(db.held_letters());
    // RabbitMQ keeps dead letters (and delayed retries) in the group's own queues.
    if let Some(side) = broker.side_queues() {
        worker = worker.with_side_queues(side);
    }
    if system.retry().mode == RetryMode::Ordered {
        worker.with_parking(db.parking())
    } else {
        worker
    }
}

/// Deletes processed-message keys older than `retention`, now and then, until `stop`.
/// A failed purge is logged and tried again next time: keys kept longer are harmless.
pub fn spawn_inbox_purge(db: Db, retention: Duration, stop: CancellationToken) {
    let every = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    tokio::spawn(async move {
        loop {
            match db.purge_processed(retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "old processed-message keys purged"),
                Err(e) => tracing::warn!(error = %e, "purging processed-message keys failed"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    });
}

/// The relay of `db`'s outbox to `broker` as lane owner `instance`, for the service `source`
/// with its `routing`, with the deployment's lease, poll and retention, reading the outbox from
/// the deployment's relay source (the WAL relay replicates from `database`'s URL).
pub fn outbox_relay(
    system: &System,
    (db, database): (&Db, &Database),
    broker: &Broker,
    (source, routing): (&str, entrega::TopicRouting),
    instance: &str,
) -> anyhow::Result<ServiceRelay> {
    let mut config = entrega::RelayConfig::new(source, routing);
    config.instance_id = instance.to_owned();
    config.lease_ttl = system.lease_ttl();
    config.poll_interval = RELAY_POLL;
    config.retention = system.retention().outbox;
    config.transitions = system.transitions().clone();
    if system.cloudevents() {
        let binding = if broker.is_amqp() {
            entrega::cloudevents::CloudEvents::amqp()
        } else {
            entrega::cloudevents::CloudEvents::kafka()
        };
        config.cloudevents = Some(binding.with_schema_base(crate::contracts::SCHEMA_BASE));
    }
    Ok(match system.relay_source() {
        RelaySource::Poll => ServiceRelay::Poll(entrega::Relay::new(
            db.outbox(),
            broker.publisher(),
            std::sync::Arc::new(entrega::SystemClock),
            config,
        )),
        RelaySource::Wal => {
            let mut wal = entrega::WalConfig::default();
            wal.recreate_slot = system.recreate_slot();
            let url = system.databases().existing_url(database);
            let relay = entrega::WalRelay::new(url, db, broker.publisher(), config, wal)
                .with_context(|| format!("the {} relay", database.name))?;
            ServiceRelay::Wal(relay)
        }
    })
}

/// Binds `start.http`, then serves `router` there (HTTPS when the deployment has TLS) as
/// `name`'s task until the component stops; returns the address it listens on.
pub async fn serve_http(
    start: &Start<'_>,
    name: &'static str,
    router: axum::Router,
) -> anyhow::Result<(std::net::SocketAddr, Task)> {
    let listener = tokio::net::TcpListener::bind(start.http)
        .await
        .with_context(|| format!("binding {}", start.http))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "{name} listening");
    let system = start.system;
    // Counted on the process's recorder, which the operations endpoint renders.
    super::ops_server::recorder();
    let task = tokio::spawn(super::http_server::serve(
        listener,
        super::http_metrics::tracked(router, name),
        system.http_limits(),
        system.http_tls()?,
        start.stop.clone(),
    ));
    Ok((addr, task))
}
