//! Adapters from km0 to the entrega engine (relay, worker, shutdown).

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::services::inventario::ConsumerStats;
use crate::system::System;

pub(crate) async fn spawn_relay(
    _system: &System,
    _instance: &str,
    _stop: CancellationToken,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    anyhow::bail!("relay not wired yet")
}

pub(crate) async fn spawn_consumer(
    _system: &System,
    _instance: &str,
    _stop: CancellationToken,
) -> anyhow::Result<(JoinHandle<anyhow::Result<()>>, Arc<ConsumerStats>)> {
    anyhow::bail!("consumer not wired yet")
}

pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
