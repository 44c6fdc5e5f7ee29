//! The payment gateway simulator as one component (`km0 run pasarela`): its HTTP API on the
//! process's address, its own ledger database, and the faults of this run.

use anyhow::Context as _;
use async_trait::async_trait;

use super::{app, Ledger, PasarelaState};
use crate::wiring::{serve_http, Component, Database, InUp, Start, Started};

/// The gateway's ledger: idempotency keys, charges, refunds. No entrega tables.
pub const DATABASE: Database = Database {
    name: "pasarela",
    migrate: |db| Box::pin(async move { Ledger::new(db.clone()).migrate().await }),
    entrega_tables: false,
    outbox: false,
};

/// pasarela: see the module.
pub const COMPONENT: Pasarela = Pasarela;

/// See [`COMPONENT`].
#[derive(Debug, Clone, Copy)]
pub struct Pasarela;

#[async_trait]
impl Component for Pasarela {
    fn name(&self) -> &'static str {
        "pasarela"
    }

    fn about(&self) -> &'static str {
        "The payment gateway simulator (HTTP on `--http`, its own ledger database)"
    }

    fn database(&self) -> Option<&'static Database> {
        Some(&DATABASE)
    }

    fn uses_broker(&self) -> bool {
        false
    }

    fn serves_http(&self) -> bool {
        true
    }

    fn in_up(&self) -> InUp {
        InUp::Apart
    }

    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let ledger = start
            .system
            .pasarela()
            .await
            .context("opening the pasarela ledger")?;
        let db = ledger.db().clone();
        let state = PasarelaState::new(ledger, start.components.faults.clone());
        let (addr, task) = serve_http(&start, "pasarela", app(state)).await?;
        Ok(Started {
            tasks: vec![("pasarela", task)],
            http_addr: Some(addr),
            databases: vec![("pasarela", db)],
            ..Started::default()
        })
    }
}
