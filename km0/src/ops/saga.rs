//! `km0 saga ...`: the order sagas as an operator sees them: a list by state, one saga's
//! timeline (every step, its key, its sends, the answers, the compensations, with times), and
//! sending again the compensation a saga waits on for an operator (recorded with who asked).

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::Subcommand;
use entrega::saga::{HistoryEntry, SagaRecord, SagaStatus, Sagas};
use entrega_core::utc::format_utc_ms;
use serde_json::{json, Value};

use crate::wiring::System;

/// `km0 saga ...`.
#[derive(Debug, Subcommand)]
pub enum SagaCommand {
    /// Sagas, newest first, with their state, step and reason.
    List {
        /// Only sagas in this state: running, compensating, completed, compensated,
        /// needs_operator (the former Spanish names are understood too).
        #[arg(long, alias = "estado", value_parser = parse_status)]
        state: Option<SagaStatus>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One saga's timeline.
    Show {
        /// The order id (the saga's id).
        order: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Sends again the compensation a saga waits on for an operator, recorded in its history.
    Retry {
        /// The order id.
        order: String,
    },
}

fn parse_status(name: &str) -> Result<SagaStatus, String> {
    SagaStatus::parse(name).ok_or_else(|| {
        let names: Vec<&str> = SagaStatus::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown state `{name}` (one of {})", names.join(", "))
    })
}

/// Runs a `km0 saga` command.
pub async fn run(system: &System, command: SagaCommand) -> anyhow::Result<()> {
    let store = system
        .pedidos()
        .await
        .context("opening the pedidos database")?;
    let sagas = system.sagas(&store).await.context("opening the sagas")?;
    let done = match command {
        SagaCommand::List { state, limit, json } => list(&sagas, state, limit, json).await,
        SagaCommand::Show { order, json } => show(&sagas, &order, json).await,
        SagaCommand::Retry { order } => {
            // Kept in the saga's history: the user the system says runs this command.
            let operator = crate::ops::identity::os_user();
            sagas
                .retry(&order, &operator)
                .await
                .with_context(|| format!("retrying saga {order}"))?;
            crate::ops::terminal::println(&format!(
                "saga {order}: compensation sent again, asked by {operator}"
            ));
            Ok(())
        }
    };
    store.db().close().await;
    done
}

async fn list(
    sagas: &Sagas,
    status: Option<SagaStatus>,
    limit: usize,
    json: bool,
) -> anyhow::Result<()> {
    let found = sagas.list(status, limit).await.context("listing sagas")?;
    let counts = sagas.counts().await.context("counting sagas")?;
    if json {
        let counts: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(s, n)| (s.as_str().to_owned(), json!(n)))
            .collect();
        let items: Vec<Value> = found.iter().map(|s| saga_json(sagas, s)).collect();
        crate::ops::terminal::println(&json!({"recuento": counts, "sagas": items}).to_string());
        return Ok(());
    }
    crate::ops::terminal::print(&render_list(sagas, &found, &counts));
    Ok(())
}

async fn show(sagas: &Sagas, id: &str, json: bool) -> anyhow::Result<()> {
    let Some((saga, history)) = sagas.show(id).await.context("reading the saga")? else {
        anyhow::bail!("no saga for order {id}");
    };
    if json {
        let mut value = saga_json(sagas, &saga);
        value["datos"] = saga.input.clone();
        value["resultados"] = Value::Object(saga.results.clone());
        value["historial"] = history.iter().map(entry_json).collect();
        crate::ops::terminal::println(&value.to_string());
    } else {
        crate::ops::terminal::print(&render_timeline(sagas, &saga, &history));
    }
    Ok(())
}

fn step_name(sagas: &Sagas, saga: &SagaRecord) -> String {
    sagas.step_name(saga.step).unwrap_or("?").to_owned()
}

fn time(ms: i64) -> String {
    format_utc_ms(ms)
}

/// One saga as JSON (times in epoch ms).
pub fn saga_json(sagas: &Sagas, saga: &SagaRecord) -> Value {
    json!({
        "pedido": saga.id,
        "estado": saga.status.as_str(),
        "paso": step_name(sagas, saga),
        "fase": saga.phase.as_str(),
        "intentos": saga.attempts,
        "motivo": saga.reason,
        "proximo_ms": saga.next_at_ms,
        "plazo_ms": saga.deadline_at_ms,
        "creada_ms": saga.created_ms,
        "actualizada_ms": saga.updated_ms,
    })
}

fn entry_json(e: &HistoryEntry) -> Value {
    json!({
        "n": e.n,
        "en_ms": e.at_ms,
        "que": e.what.as_str(),
        "paso": e.step,
        "fase": e.phase.as_str(),
        "clave": e.key,
        "intento": e.attempt,
        "detalle": e.detail,
    })
}

/// The list as text: counts per state, then one line per saga.
pub fn render_list(sagas: &Sagas, found: &[SagaRecord], counts: &[(SagaStatus, i64)]) -> String {
    let mut out = String::new();
    let totals: Vec<String> = counts.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    let _ = writeln!(
        out,
        "sagas: {}",
        if totals.is_empty() {
            "none".into()
        } else {
            totals.join(", ")
        }
    );
    if found.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<24} {:<18} {:<8} {:<13} {:>7}  {:<24} reason",
        "order", "state", "step", "phase", "sends", "updated"
    );
    for s in found {
        let _ = writeln!(
            out,
            "{:<24} {:<18} {:<8} {:<13} {:>7}  {:<24} {}",
            s.id,
            s.status.as_str(),
            step_name(sagas, s),
            s.phase.as_str(),
            s.attempts,
            time(s.updated_ms),
            s.reason.as_deref().unwrap_or("-"),
        );
    }
    out
}

/// One saga's timeline as text.
pub fn render_timeline(sagas: &Sagas, saga: &SagaRecord, history: &[HistoryEntry]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "saga {} ({}): {}",
        saga.id,
        saga.kind,
        saga.status.as_str()
    );
    let _ = writeln!(
        out,
        "step: {} ({}), sends: {}, reason: {}",
        step_name(sagas, saga),
        saga.phase.as_str(),
        saga.attempts,
        saga.reason.as_deref().unwrap_or("-")
    );
    if let Some(next) = saga.next_at_ms {
        let _ = writeln!(out, "next timer: {}", time(next));
    }
    let _ = writeln!(
        out,
        "started: {}, changed: {}",
        time(saga.created_ms),
        time(saga.updated_ms)
    );
    for e in history {
        let _ = writeln!(
            out,
            "  {:>3} {} {:<18} {:<8} {:<13} {:<24} {:<4} {}",
            e.n,
            time(e.at_ms),
            e.what.as_str(),
            if e.step.is_empty() { "-" } else { &e.step },
            e.phase.as_str(),
            e.key.as_deref().unwrap_or("-"),
            e.attempt
                .map_or_else(|| "-".to_owned(), |a| format!("#{a}")),
            e.detail.as_deref().unwrap_or(""),
        );
    }
    out
}
