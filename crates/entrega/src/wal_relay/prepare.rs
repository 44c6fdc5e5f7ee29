//! Before a session: the server writes logical WAL, the publication exists, and the slot is
//! one to stream from, one to create, or one that needs an operator.

use entrega_core::StoreError;
use entrega_postgres::wal::slot;
use entrega_postgres::PgPool;

use super::session::End;
use super::WalError;

/// What the next session does with the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// Stream from the existing slot.
    Stream,
    /// Create the slot (dropping the existing one when `recreate`), publish the rows
    /// committed before it, then end the session (the next one streams).
    Create {
        /// The operator asked for a new slot.
        recreate: bool,
    },
}

/// Reads the server's setting, the publication, the slot and entrega's record of it, for
/// the relay of `database`. `recreate`: the operator asked for a new slot.
pub(super) async fn plan(
    pool: &PgPool,
    database: &str,
    name: &str,
    recreate: bool,
) -> Result<Plan, End> {
    let level = slot::wal_level(pool).await.map_err(store)?;
    if level != "logical" {
        return Err(End::Fatal(WalError::WalLevel { found: level }));
    }
    slot::ensure_publication(pool).await.map_err(store)?;
    let state = slot::slot_state(pool, name).await.map_err(store)?;
    if let Some(state) = &state {
        if state.active {
            return Err(End::SlotBusy(state.active_pid.unwrap_or_default()));
        }
    }
    if recreate {
        // Dropped under the creation's lock (`catch_up`), never here.
        return Ok(Plan::Create { recreate: true });
    }
    let record = slot::slot_record(pool, name).await.map_err(store)?;
    match (state, record) {
        (Some(state), _) if state.is_lost() => Err(End::Fatal(WalError::SlotLost {
            slot: name.to_owned(),
        })),
        (Some(state), _) if state.plugin.as_deref() != Some("pgoutput") => Err(foreign(
            name,
            format!("its plugin is {:?}, not pgoutput", state.plugin),
        )),
        (Some(state), _) if state.database.as_deref() != Some(database) => Err(foreign(
            name,
            format!("it decodes database {:?}, not {database}", state.database),
        )),
        (Some(_), None) => Err(foreign(
            name,
            "it exists but entrega did not create it (drop it, or name another slot)".into(),
        )),
        (Some(_), Some(true)) => Ok(Plan::Stream),
        // Its creation was cut before the rows committed earlier were published: nothing was
        // streamed from it, so it is made again with a new snapshot.
        (Some(_), Some(false)) | (None, Some(false)) | (None, None) => {
            Ok(Plan::Create { recreate: false })
        }
        (None, Some(true)) => {
            if slot::left_behind_by_failover(pool, name)
                .await
                .map_err(store)?
            {
                tracing::warn!(
                    slot = name,
                    "replication slot missing on a server promoted since it was created (a \
                     failover; the standby had no copy of it): publishing the rows still \
                     pending, then streaming from a new slot"
                );
                Ok(Plan::Create { recreate: false })
            } else {
                Err(End::Fatal(WalError::SlotDropped {
                    slot: name.to_owned(),
                }))
            }
        }
    }
}

fn foreign(slot: &str, why: String) -> End {
    End::Fatal(WalError::ForeignSlot {
        slot: slot.to_owned(),
        why,
    })
}

/// A store failure: retried when transient, the relay stopped when not.
pub(super) fn store(e: StoreError) -> End {
    if e.is_transient() {
        End::Transient(e.to_string())
    } else {
        End::Fatal(WalError::Store(e))
    }
}
