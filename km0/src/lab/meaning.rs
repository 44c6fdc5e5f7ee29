//! Scenario 11: a producer's new release changes what a field means, on the embedded default.
//! `pedido.creado` carried `importe` in cents; from the order the seed picks, the new release
//! sends euros. The naive release keeps the field and the version (1); the pattern's bumps the
//! version (2) and names the new meaning (`importe_euros`), and analitica reads each version it
//! knows by its own contract.
//!
//! The effect is analitica's revenue row per order; the ledger compares it with what the
//! customer was actually charged.

use std::time::Duration;

use anyhow::{bail, Context as _};
use entrega::db::{query, Db, Migration};
use entrega::Broker;
use entrega_core::{Envelope, OutgoingMessage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::embedded::{order_ids, wire, with_embedded, TOPIC};
use super::{Ledger, Side, SideRun};

/// Orders placed.
const ORDERS: usize = 40;
const GROUP: &str = "lab.analitica";

const TABLES: &[Migration] = &[Migration::same(
    1,
    "the lab's revenue",
    "CREATE TABLE IF NOT EXISTS lab_revenue (
         order_id TEXT NOT NULL,
         cents    INTEGER NOT NULL
     );",
)];

/// What order `n` costs, in cents (never a whole number of euros, so a unit mix-up shows).
fn price_cents(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(0) * 137 + 1_050
}

/// Runs one side in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let (dir, seed, side) = (r.dir.as_path(), r.seed, r.side);
    with_embedded(dir, "analitica", async |db, broker| {
        run_on(db, broker, seed, side).await
    })
    .await
}

/// `pedido.creado` of order `n` as the release at hand writes it.
fn order_created(n: usize, new_release: bool, side: Side) -> OutgoingMessage {
    let order = format!("P-{n:03}");
    let cents = price_cents(n);
    let euros = cents as f64 / 100.0;
    let (version, data) = match (new_release, side) {
        (false, _) => (1, json!({"id": order, "importe": cents})),
        // Same field, same version, a new unit.
        (true, Side::Naive) => (1, json!({"id": order, "importe": euros})),
        // A new meaning is a new version, under a name that says it.
        (true, Side::Pattern) => (2, json!({"id": order, "importe_euros": euros})),
    };
    let mut envelope = Envelope::new("pedido.creado", "pedidos", data);
    envelope.version = version;
    wire(TOPIC, &order, &envelope, envelope.to_bytes())
}

async fn run_on(db: &Db, broker: &Broker, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    db.apply_migrations("lab", TABLES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let release_at = StdRng::seed_from_u64(seed).gen_range(ORDERS / 4..ORDERS * 3 / 4);
    let messages: Vec<OutgoingMessage> = (1..=ORDERS)
        .map(|n| order_created(n, n >= release_at, side))
        .collect();
    broker.publisher().publish(&messages).await?;

    let mut sub = broker.subscriber().subscribe(GROUP, TOPIC, "lab-0").await?;
    let mut handled = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handled < ORDERS && std::time::Instant::now() < deadline {
        for record in sub.poll(50, Duration::from_millis(100)).await? {
            let envelope = Envelope::parse(&record.payload).context("the lab's own event")?;
            let order = envelope.data["id"].as_str().unwrap_or_default().to_owned();
            let cents = revenue_cents(&envelope)?;
            db.execute(
                query("INSERT INTO lab_revenue (order_id, cents) VALUES ($1, $2)")
                    .bind(&order)
                    .bind(cents),
            )
            .await?;
            sub.commit(&[(record.partition, record.offset + 1)]).await?;
            handled += 1;
        }
    }
    sub.close().await?;

    let orders = order_ids(ORDERS);
    let rows: Vec<(String, i64)> = db
        .fetch_all(query("SELECT order_id, cents FROM lab_revenue"))
        .await?;
    let applied: Vec<String> = rows.iter().map(|(o, _)| o.clone()).collect();
    let mut ledger = Ledger::from_effects(&orders, &applied);
    ledger.wrong = rows
        .iter()
        .filter(|(order, cents)| {
            let n: usize = order.trim_start_matches("P-").parse().unwrap_or(0);
            *cents != price_cents(n)
        })
        .count() as u64;
    let total: i64 = rows.iter().map(|(_, c)| c).sum();
    let charged: i64 = (1..=ORDERS).map(price_cents).sum();
    ledger.fault = format!(
        "a new release of pedidos sends euros from P-{release_at:03} on ({}); revenue read: \
         {:.2} EUR of {:.2} EUR charged",
        match side {
            Side::Naive => "same field, version 1",
            Side::Pattern => "importe_euros, version 2",
        },
        total as f64 / 100.0,
        charged as f64 / 100.0
    );
    Ok(ledger)
}

/// analitica's reading: version 1 carries cents in `importe`, version 2 euros in
/// `importe_euros`; any other version is refused, never guessed.
fn revenue_cents(envelope: &Envelope) -> anyhow::Result<i64> {
    match envelope.version {
        1 => match &envelope.data["importe"] {
            // A number that is not whole cents is taken as it comes: the naive consumer has no
            // way to know the unit changed.
            v if v.is_i64() => Ok(v.as_i64().unwrap_or(0)),
            v => Ok(v.as_f64().unwrap_or(0.0).round() as i64),
        },
        2 => {
            let euros = envelope.data["importe_euros"]
                .as_f64()
                .context("version 2 without importe_euros")?;
            Ok((euros * 100.0).round() as i64)
        }
        other => bail!("pedido.creado version {other} is not one analitica reads"),
    }
}
