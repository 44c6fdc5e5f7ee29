//! What a relay reading the outbox from PostgreSQL's WAL needs of PostgreSQL: the replication
//! session's settings ([`replication_config`]), decoding `pgoutput` ([`pgoutput`]) into outbox
//! rows ([`OutboxColumns`]), and the publication, slot and heartbeat ([`slot`]). The relay
//! itself is `entrega::WalRelay`.
//!
//! The replication protocol is spoken by the `pgwire-replication` crate (re-exported as
//! [`replication`]): connecting, TLS, SCRAM, `START_REPLICATION`, keepalives and standby
//! status updates. The pgoutput messages a relay of inserts acts on are decoded here.

mod outbox_row;
pub mod pgoutput;
pub mod slot;
mod target;

pub use outbox_row::{OutboxColumns, RowError};
pub use pgwire_replication as replication;
pub use target::{current_replication_config, replication_config};
