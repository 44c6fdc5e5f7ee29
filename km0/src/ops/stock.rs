//! `km0 stock`: what inventario has of each product, and adding units (a delivery from a
//! producer, a correction). An addition writes the stock and its `stock.actualizado`
//! (`motivo` `reposicion`) in one transaction, as every stock change does, so the services
//! that follow the stock hear of it.

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::json;

use crate::services::input::id_problem;
use crate::wiring::System;

/// Most units one addition may add.
pub const MAX_UNITS: i32 = 1_000_000;

/// `km0 stock ...`.
#[derive(Debug, Subcommand)]
pub enum StockCommand {
    /// Every product and its units.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Adds units of a product (the product too, when inventario does not have it yet).
    Add {
        /// The product (`producto`), e.g. `queso-curado`.
        product: String,
        /// How many units to add, 1 to 1,000,000.
        #[arg(value_parser = clap::value_parser!(i32).range(1..=i64::from(MAX_UNITS)))]
        units: i32,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `km0 stock` command.
pub async fn run(system: &System, command: StockCommand) -> anyhow::Result<()> {
    let store = system
        .inventario()
        .await
        .context("opening the inventario database")?;
    let outcome = match command {
        StockCommand::List { json } => list(&store, json).await,
        StockCommand::Add {
            product,
            units,
            json,
        } => add(&store, &product, units, json).await,
    };
    store.db().close().await;
    crate::ops::terminal::print(&outcome?);
    Ok(())
}

async fn list(
    store: &crate::services::inventario::StockStore,
    json: bool,
) -> anyhow::Result<String> {
    let all = store.all().await.context("reading the stock")?;
    if json {
        let rows: Vec<_> = all
            .iter()
            .map(|(product, units)| json!({"producto": product, "unidades": units}))
            .collect();
        return Ok(serde_json::to_string_pretty(&rows)? + "\n");
    }
    let width = all.iter().map(|(p, _)| p.len()).max().unwrap_or(7).max(7);
    let mut out = format!("{:<width$}  {:>9}\n", "product", "units");
    for (product, units) in &all {
        out.push_str(&format!("{product:<width$}  {units:>9}\n"));
    }
    Ok(out)
}

async fn add(
    store: &crate::services::inventario::StockStore,
    product: &str,
    units: i32,
    json: bool,
) -> anyhow::Result<String> {
    if let Some(why) = id_problem(product) {
        anyhow::bail!("not a product name: {why}");
    }
    let (before, after) = store
        .restock(product, units)
        .await
        .with_context(|| format!("adding {units} units of {product}"))?;
    Ok(if json {
        serde_json::to_string_pretty(
            &json!({"producto": product, "antes": before, "despues": after}),
        )? + "\n"
    } else {
        format!("{product}: {before} -> {after} units (stock.actualizado sent through inventario's outbox)\n")
    })
}
