//! The data every bench starts from: orders of two lines over the seed's products, their
//! `pedido.creado` events, and the bulk loads that put them in an outbox or on the topic.
//!
//! The generators are deterministic in everything but the event ids, so the engine's database
//! and the pgbench ceiling's database are filled alike: same aggregates, hence same lanes and
//! partitions, same payload sizes.

use anyhow::Context as _;
use entrega::ContractError;
use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{now_ms, Envelope, Headers, NewEvent, OutgoingMessage, Publisher};

use crate::services::inventario::{StockStore, INITIAL_STOCK};
use crate::services::pedidos::{order_created, NewOrder, OrderLine, ORDER_CREATED, SOURCE};
use entrega::db::{query, Backend, Db};

/// Units given to every product before a bench, so no order is ever refused for stock.
pub(crate) const BENCH_UNITS: i32 = 1_000_000_000;

/// Rows written per transaction while prefilling.
const CHUNK: usize = 1_000;

/// The seed's product number `i` (wrapping around the five).
pub(crate) fn product(i: usize) -> &'static str {
    INITIAL_STOCK[i % INITIAL_STOCK.len()].0
}

/// Order `id`, number `n`: two lines of one unit, products `n` and `n + 1`, like an average
/// demo order (one to three lines).
pub(crate) fn order(id: String, n: usize) -> NewOrder {
    let line = |i: usize| OrderLine {
        product: product(i).to_owned(),
        quantity: 1,
        price_cents: 350,
    };
    NewOrder {
        id,
        customer: "bench".to_owned(),
        market: "girona".to_owned(),
        lines: vec![line(n), line(n + 1)],
        card: None,
        address: None,
    }
}

/// The aggregate id of order `n`; the same in every run, so lanes and partitions match.
pub(crate) fn aggregate_id(n: usize) -> String {
    format!("P-bench-{n:06}")
}

/// `events` events of `aggregates` orders, round robin, so every order gets
/// `events / aggregates` of them in turn (its `pedido.creado` payload each time).
pub(crate) fn outbox_events(
    events: usize,
    aggregates: usize,
) -> Result<Vec<NewEvent>, ContractError> {
    let aggregates = aggregates.max(1);
    (0..events)
        .map(|i| {
            let n = i % aggregates;
            order_created(&order(aggregate_id(n), n))
        })
        .collect()
}

/// The same events as the relay would publish them on `topic` (`pedidos.eventos`).
pub(crate) fn topic_messages(
    topic: &str,
    messages: usize,
    aggregates: usize,
) -> Result<Vec<OutgoingMessage>, ContractError> {
    Ok(outbox_events(messages, aggregates)?
        .into_iter()
        .map(|event| {
            let envelope = Envelope {
                id: event.id,
                kind: ORDER_CREATED.to_owned(),
                version: 1,
                timestamp_ms: now_ms(),
                source: SOURCE.to_owned(),
                data: event.payload,
            };
            OutgoingMessage {
                topic: topic.to_owned(),
                key: Some(event.aggregate_id),
                headers: Headers::new()
                    .with(TIPO, ORDER_CREATED)
                    .with(ID_EVENTO, event.id.to_string()),
                payload: envelope.to_bytes(),
            }
        })
        .collect())
}

/// Writes `events` to the outbox of `db`, a thousand per transaction.
pub(crate) async fn prefill_outbox(db: &Db, events: &[NewEvent]) -> anyhow::Result<()> {
    for chunk in events.chunks(CHUNK) {
        let mut tx = db.begin().await?;
        tx.enqueue_all(chunk).await?;
        tx.commit().await?;
    }
    settle(db, &["outbox"]).await
}

/// Appends `messages` to the topic, a thousand per publish.
pub(crate) async fn prefill_topic(
    publisher: &dyn Publisher,
    messages: &[OutgoingMessage],
) -> anyhow::Result<()> {
    for chunk in messages.chunks(CHUNK) {
        publisher
            .publish(chunk)
            .await
            .context("prefilling the topic")?;
    }
    Ok(())
}

/// Gives every product [`BENCH_UNITS`] units.
pub(crate) async fn fill_stock(stock: &StockStore) -> anyhow::Result<()> {
    for (name, _) in INITIAL_STOCK {
        stock.set_units(name, BENCH_UNITS).await?;
    }
    settle(stock.db(), &["stock"]).await
}

/// Leaves a freshly loaded database in a steady state before the clock starts: statistics
/// for the planner, dead rows vacuumed, and (PostgreSQL) the load's WAL checkpointed so a
/// checkpoint does not land in the middle of the measurement.
pub(crate) async fn settle(db: &Db, tables: &[&str]) -> anyhow::Result<()> {
    // Maintenance statements have no common form: each backend's, side by side.
    match db.backend() {
        Backend::Postgres => {
            for table in tables {
                db.execute(query(format!("VACUUM ANALYZE {table}"))).await?;
            }
            // Needs superuser (or pg_checkpoint); without it the run is merely noisier.
            if let Err(e) = db.execute(query("CHECKPOINT")).await {
                tracing::debug!(error = %e, "checkpoint before the bench skipped");
            }
        }
        Backend::Sqlite => {
            db.execute(query("ANALYZE")).await?;
            db.execute(query("PRAGMA wal_checkpoint(TRUNCATE)")).await?;
        }
    }
    Ok(())
}
