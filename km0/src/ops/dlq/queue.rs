//! `km0 dlq` on RabbitMQ: inventario's dead-letter queue (`inventario.pedidos.dlq`) through
//! [`QueueDeadLetters`]. A letter is `<queue>/0/<position>`, as `list` prints it.

use std::sync::Arc;

use anyhow::Context as _;
use entrega::dlq::{DiscardOptions, DlqError, DlqFilter, QueueDeadLetters, ReplayOptions};
use entrega_core::DlqStore;

use super::args::{DlqCommand, FilterArgs};
use super::{emit, render};
use crate::ops::identity::os_user;
use crate::services::inventario;
use crate::wiring::{dead_letter_topic, Broker};

/// Runs one `km0 dlq` command on the broker's RabbitMQ; returns what to print.
pub(super) async fn execute(
    broker: &Broker,
    store: Arc<dyn DlqStore>,
    command: DlqCommand,
) -> anyhow::Result<String> {
    let amqp = broker.as_amqp().context("not a RabbitMQ broker")?;
    let tool = QueueDeadLetters::new(amqp.clone(), inventario::GROUP, inventario::TOPIC, store);
    match command {
        DlqCommand::List { filter, json, .. } => {
            let letters = tool.list(&queue_filter(&tool, &filter)?).await?;
            let rows: Vec<_> = letters.iter().map(render::letter_json).collect();
            emit(json, &rows, |_| render::list_table(&letters))
        }
        DlqCommand::Stats { .. } => Err(DlqError::ConflictingFilters {
            reason: "`stats` reads dead-letter topics; on RabbitMQ, `km0 lag` counts the \
                     dead-letter queue and `km0 dlq list --json` lists it"
                .to_owned(),
        }
        .into()),
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
            if let Some(other) = group.filter(|g| g != inventario::GROUP) {
                return Err(DlqError::ConflictingFilters {
                    reason: format!(
                        "a RabbitMQ dead letter goes back to the group that dead-lettered it \
                         ({}), not to `{other}`",
                        inventario::GROUP
                    ),
                }
                .into());
            }
            let mut options = ReplayOptions::new(os_user());
            options.dry_run = dry_run;
            options.max_replays = max_replays;
            options.expect_selection = expect;
            let report = tool
                .replay(&queue_filter(&tool, &filter)?, &options)
                .await?;
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
            let report = tool
                .discard(&queue_filter(&tool, &filter)?, &options)
                .await?;
            emit(json, &report, render::action_text)
        }
        DlqCommand::Audit { limit, json } => {
            let entries = tool.audit(limit).await?;
            super::render_audit(&entries, json)
        }
        // Answered before the broker's tooling is opened (`super::run`).
        DlqCommand::Held { .. } | DlqCommand::SendHeld { .. } => Ok(String::new()),
    }
}

/// The filter, with `--topic pedidos.eventos` (or its dead-letter topic) taken as the queue.
fn queue_filter(tool: &QueueDeadLetters, args: &FilterArgs) -> anyhow::Result<DlqFilter> {
    let mut filter = args.to_filter()?;
    if filter.topic.as_deref() == Some(dead_letter_topic().as_str()) {
        filter.topic = Some(tool.queue().to_owned());
    }
    Ok(filter)
}
