//! reparto's answers to which cities it covers (`reparto.cobertura`), served on a test
//! deployment's broker for as long as the test wants them.

use std::sync::Arc;
use std::time::Duration;

use entrega::rpc::RpcServer;
use entrega::CancellationToken;
use km0::services::reparto::CoverageAnswers;
use km0::wiring::System;

/// reparto's coverage server, running.
pub struct CoverageServer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CoverageServer {
    /// Serves from `system`'s reparto database, once its queue is open.
    pub async fn start(system: &System) -> Self {
        let reparto = system.reparto().await.unwrap();
        let broker = system.broker().await.unwrap();
        let server = RpcServer::new(
            broker.rpc(1),
            Arc::new(CoverageAnswers::new(reparto)),
            CoverageAnswers::config(),
        );
        let opened = server.opened();
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { server.run(stop).await.unwrap() }
        });
        tokio::time::timeout(Duration::from_secs(20), opened)
            .await
            .expect("reparto opened its queue");
        Self { stop, task }
    }

    /// Stops answering.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}
