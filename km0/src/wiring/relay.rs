//! A service's outbox relay, from whichever source the deployment reads the outbox:
//! polling the table (`--relay-source poll`, every database) or PostgreSQL's WAL
//! (`--relay-source wal`, docs/adr/0021-wal-relay.md).

use std::sync::Arc;

use entrega::{CancellationToken, Relay, RelayStats, WalRelay};

/// Where the relays read the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RelaySource {
    /// Poll the table for unpublished rows (SQLite and PostgreSQL).
    #[default]
    Poll,
    /// Decode the outbox's inserts from PostgreSQL's logical replication stream.
    Wal,
}

impl RelaySource {
    /// The name the command line takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Wal => "wal",
        }
    }
}

/// One service's relay, of either source.
#[derive(Debug)]
pub enum ServiceRelay {
    /// The polling relay.
    Poll(Relay),
    /// The WAL relay.
    Wal(WalRelay),
}

impl ServiceRelay {
    /// The relay's counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        match self {
            Self::Poll(relay) => relay.stats(),
            Self::Wal(relay) => relay.stats(),
        }
    }

    /// Runs until `stop`; the WAL relay also stops when its slot needs an operator.
    pub async fn run(&self, stop: CancellationToken) -> anyhow::Result<()> {
        match self {
            Self::Poll(relay) => Ok(relay.run(stop).await?),
            Self::Wal(relay) => Ok(relay.run(stop).await?),
        }
    }
}
