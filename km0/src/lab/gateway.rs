//! The payment gateway simulator (km0's pasarela) served on loopback over a ledger of the
//! side's own, and the charges it made, read back from that ledger.

use std::path::Path;

use entrega::db::{query, Db};

use crate::services::pasarela::{self, Faults, PasarelaState};

/// A gateway serving on an ephemeral port of 127.0.0.1 until dropped.
pub(super) struct Gateway {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    db: Db,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    /// Serves a gateway whose ledger is `pasarela.db` in `dir`.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let db = Db::connect(&format!("sqlite://{}", dir.join("pasarela.db").display())).await?;
        let ledger = pasarela::Ledger::new(db.clone());
        ledger.migrate().await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let app = pasarela::app(PasarelaState::new(ledger, Faults::default()));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { base, db, server })
    }

    /// The `referencia` of every approved charge, in the order charged.
    pub async fn charges(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .db
            .fetch_all(query(
                "SELECT referencia FROM cargos WHERE resultado = 'aprobado' ORDER BY creado_ms, id",
            ))
            .await?
            .into_iter()
            .map(|(reference,): (String,)| reference)
            .collect())
    }

    /// Stops serving and closes the ledger.
    pub async fn stop(self) {
        self.server.abort();
        self.db.close().await;
    }
}
