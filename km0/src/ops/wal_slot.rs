//! The WAL relay's replication slots in `km0 outbox status`: every slot entrega created for
//! a service's outbox (`entrega_wal_slots`), with what PostgreSQL says of it now.

use std::fmt::Write as _;

use entrega::db::query;
use entrega::Db;
use entrega_core::StoreError;
use entrega_postgres::wal::slot::{slot_state, SlotState};
use serde_json::{json, Value};

/// One slot a WAL relay created, as the server shows it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    /// Its name.
    pub name: String,
    /// Whether the rows committed before it existed were published (its creation finished).
    pub caught_up: bool,
    /// The server's view; `None` when the slot no longer exists (dropped, or never finished).
    pub state: Option<SlotState>,
}

impl SlotView {
    /// `streaming`, `idle`, `lost` or `dropped`.
    pub fn condition(&self) -> &'static str {
        match &self.state {
            None => "dropped",
            Some(s) if s.is_lost() => "lost",
            Some(s) if s.active => "streaming",
            Some(_) => "idle",
        }
    }
}

/// The slots the WAL relay created for the outbox in `db`; none on SQLite, or where no WAL
/// relay ever ran.
pub async fn slots_of(db: &Db) -> Result<Vec<SlotView>, StoreError> {
    let Some(pool) = db.postgres() else {
        return Ok(Vec::new());
    };
    let recorded: Vec<(String, bool)> = db
        .fetch_all(query(
            "SELECT slot, caught_up_at IS NOT NULL FROM entrega_wal_slots ORDER BY slot",
        ))
        .await?;
    let mut views = Vec::with_capacity(recorded.len());
    for (name, caught_up) in recorded {
        let state = slot_state(pool, &name).await?;
        views.push(SlotView {
            name,
            caught_up,
            state,
        });
    }
    Ok(views)
}

/// The slots as text, one line each, indented under their service.
pub fn render(slots: &[SlotView]) -> String {
    let mut out = String::new();
    for slot in slots {
        let _ = write!(out, "WAL slot {}: {}", slot.name, slot.condition());
        match &slot.state {
            Some(state) => {
                if let Some(pid) = state.active_pid.filter(|_| state.active) {
                    let _ = write!(out, " (pid {pid})");
                }
                let bytes = |b: Option<i64>| b.map_or("-".to_owned(), |b| format!("{b} bytes"));
                let _ = write!(
                    out,
                    ", retains {}, confirmed lag {}",
                    bytes(state.retained_bytes),
                    bytes(state.lag_bytes)
                );
                if let Some(safe) = state.safe_wal_bytes {
                    let _ = write!(out, ", {safe} bytes before PostgreSQL invalidates it");
                }
            }
            None if slot.caught_up => {
                let _ = write!(
                    out,
                    " (the WAL relay stops; see OPERATIONS, \"The WAL relay's slot\")"
                );
            }
            None => {}
        }
        if !slot.caught_up {
            let _ = write!(out, "; its creation has not finished");
        }
        out.push('\n');
    }
    out
}

/// The slots as JSON, for `km0 outbox status --json`.
pub fn to_json(slots: &[SlotView]) -> Value {
    slots
        .iter()
        .map(|slot| {
            let state = slot.state.as_ref();
            json!({
                "slot": slot.name,
                "condition": slot.condition(),
                "caught_up": slot.caught_up,
                "active_pid": state.and_then(|s| s.active_pid.filter(|_| s.active)),
                "wal_status": state.and_then(|s| s.wal_status.clone()),
                "retained_bytes": state.and_then(|s| s.retained_bytes),
                "lag_bytes": state.and_then(|s| s.lag_bytes),
                "safe_wal_bytes": state.and_then(|s| s.safe_wal_bytes),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(active: bool, wal_status: &str) -> SlotState {
        SlotState {
            plugin: Some("pgoutput".into()),
            database: Some("km0_pedidos".into()),
            active,
            active_pid: Some(42),
            wal_status: Some(wal_status.into()),
            retained_bytes: Some(2048),
            lag_bytes: Some(0),
            safe_wal_bytes: None,
        }
    }

    fn view(state: Option<SlotState>) -> SlotView {
        SlotView {
            name: "entrega_outbox_km0_pedidos".into(),
            caught_up: true,
            state,
        }
    }

    #[test]
    fn each_condition_is_named_with_what_the_server_says() {
        let streaming = view(Some(state(true, "reserved")));
        assert_eq!(
            render(std::slice::from_ref(&streaming)),
            "WAL slot entrega_outbox_km0_pedidos: streaming (pid 42), retains 2048 bytes, \
             confirmed lag 0 bytes\n"
        );
        assert_eq!(view(Some(state(false, "reserved"))).condition(), "idle");
        assert_eq!(view(Some(state(false, "lost"))).condition(), "lost");
        let dropped = view(None);
        assert_eq!(dropped.condition(), "dropped");
        assert!(render(&[dropped]).contains("the WAL relay stops"));
        let json = to_json(&[streaming]);
        assert_eq!(json[0]["condition"], "streaming");
        assert_eq!(json[0]["active_pid"], 42);
        assert_eq!(json[0]["retained_bytes"], 2048);
    }
}
