//! `km0 dlq`: the dead-letter tooling of `entrega::dlq` for km0's topics, on whichever broker
//! `--broker` names (the log transport on SQLite or PostgreSQL, or Kafka), and for
//! inventario's dead-letter queue `inventario.pedidos.dlq` on RabbitMQ, where a replayed or
//! discarded letter leaves the queue and the audit keeps what was done.
//!
//! The dead letters of `pedidos.eventos` are written by the inventario worker to
//! `pedidos.eventos.dlq`, so the operator state (`entrega_dlq_state`) and the audit
//! (`entrega_dlq_audit`) live in inventario's database, next to the effects a replay leads
//! to. A request the tool refuses (unknown id, conflicting filters, missing reason, bad
//! time) exits with code 2 and changes nothing.

mod args;
mod held;
mod queue;
mod render;
mod time;

use std::process::ExitCode;

use anyhow::Context as _;
use entrega::dlq::{DeadLetters, DiscardOptions, DlqError, ReplayOptions};

pub use args::{DlqCommand, FilterArgs};
pub use held::holds_letters;
pub use time::{format_utc, parse_time, InvalidTime};

use crate::ops::identity::os_user;
use crate::services::inventario;
use crate::wiring::Broker;
use crate::wiring::Database;
use crate::wiring::{dead_letter_topic, System};
use entrega::Db;

/// Exit code of a request refused before anything changed (as clap's usage errors).
pub const USAGE_EXIT: u8 = 2;

/// The dead-letter topics km0 tends, and the service whose database keeps their state.
pub fn tended_topics() -> Vec<(String, &'static Database)> {
    vec![(dead_letter_topic(), &inventario::DATABASE)]
}

/// Runs one `km0 dlq` command; a refused request prints why and exits with [`USAGE_EXIT`].
pub async fn run(system: &System, command: DlqCommand) -> anyhow::Result<ExitCode> {
    let held = match command {
        DlqCommand::Held { json } => Some(held::list(system, json).await),
        DlqCommand::SendHeld { service, json } => Some(held::send(system, service, json).await),
        _ => None,
    };
    if let Some(outcome) = held {
        crate::ops::terminal::print(&outcome?);
        return Ok(ExitCode::SUCCESS);
    }
    let broker = system.broker().await.context("opening the broker")?;
    let db = system
        .open(&inventario::DATABASE)
        .await
        .context("opening the inventario database")?;
    let store = db.dead_letters();
    let outcome = if broker.is_amqp() {
        queue::execute(&broker, store, command).await
    } else {
        let topics = tended_topics().into_iter().map(|(t, _)| t).collect();
        let mut tool = DeadLetters::new(broker.inspector(), broker.publisher(), store, topics);
        if let Some(key) = system.replay_key() {
            tool = tool.with_replay_key(key.clone());
        }
        execute(&tool, command).await
    };
    close(&broker, &db).await;
    match outcome {
        Ok(text) => {
            crate::ops::terminal::print(&text);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if is_usage(&e) => {
            eprintln!("km0: {e:#}");
            Ok(ExitCode::from(USAGE_EXIT))
        }
        Err(e) => Err(e),
    }
}

async fn close(broker: &Broker, db: &Db) {
    broker.close().await;
    db.close().await;
}

fn is_usage(e: &anyhow::Error) -> bool {
    e.downcast_ref::<DlqError>().is_some_and(DlqError::is_usage)
        || e.downcast_ref::<InvalidTime>().is_some()
}

/// `value` as pretty JSON when asked, else as `text` renders it.
pub(super) fn emit<T: serde::Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<String> {
    if json {
        Ok(format!("{}\n", serde_json::to_string_pretty(value)?))
    } else {
        Ok(text(value))
    }
}

/// Runs the command; returns what to print.
async fn execute(tool: &DeadLetters, command: DlqCommand) -> anyhow::Result<String> {
    match command {
        DlqCommand::List { filter, all, json } => {
            let letters = tool.list(&filter.to_filter()?, all).await?;
            let rows: Vec<_> = letters.iter().map(render::letter_json).collect();
            emit(json, &rows, |_| render::list_table(&letters))
        }
        DlqCommand::Stats {
            filter,
            group,
            json,
        } => {
            let stats = tool.stats(&filter.to_filter()?, group.as_deref()).await?;
            emit(json, &stats, render::stats_text)
        }
        DlqCommand::Show { id, json } => {
            let (letter, history) = tool.show(&id).await?;
            let value = render::show_json(&letter, &history);
            emit(json, &value, |_| render::show_text(&letter, &history))
        }
        DlqCommand::Replay {
            filter,
            dry_run,
            max_replays,
            group,
            expect,
            json,
        } => {
            let mut options = ReplayOptions::new(os_user());
            options.dry_run = dry_run;
            options.max_replays = max_replays;
            options.expect_selection = expect;
            options.group = group;
            let report = tool.replay(&filter.to_filter()?, &options).await?;
            emit(json, &report, render::action_text)
        }
        DlqCommand::Discard {
            filter,
            reason,
            dry_run,
            expect,
            json,
        } => {
            let mut options = DiscardOptions::new(os_user(), reason);
            options.dry_run = dry_run;
            options.expect_selection = expect;
            let report = tool.discard(&filter.to_filter()?, &options).await?;
            emit(json, &report, render::action_text)
        }
        DlqCommand::Audit { limit, json } => render_audit(&tool.audit(limit).await?, json),
        DlqCommand::Held { .. } | DlqCommand::SendHeld { .. } => Ok(String::new()),
    }
}

/// Audit entries as `km0 dlq audit` prints them: lines, or JSON.
pub fn render_audit(entries: &[entrega_core::DlqAuditEntry], json: bool) -> anyhow::Result<String> {
    emit(json, &render::audit_json(entries), |_| {
        render::audit_text(entries)
    })
}
