//! The messages an outbox row is published as, by either relay: topic by `agregado`, key
//! `agregado_id`, the seed's headers, the row's own headers, the envelope, and the CloudEvents
//! attributes and transition copies the relay's settings ask for.

use entrega_contracts::transition;
use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Headers, OutboxRow, OutgoingMessage, RawJson, TransportError};

use crate::relay_config::RelayConfig;

/// The messages of `row` onto `batch`: its own, preceded by its older version's when the
/// relay publishes its type at both during a transition. An aggregate nothing routes is
/// refused for good, as a transport refuses a message, so the row alone is held back and
/// its lane goes on.
pub(crate) fn messages(
    config: &RelayConfig,
    row: &OutboxRow,
    batch: &mut Vec<OutgoingMessage>,
) -> Result<(), TransportError> {
    let topic =
        config
            .routing
            .topic_for(&row.aggregate)
            .ok_or_else(|| TransportError::Rejected {
                reason: format!("no topic is routed for aggregate `{}`", row.aggregate),
            })?;
    let headers = row
        .headers
        .clone()
        .with(TIPO, row.kind.clone())
        .with(ID_EVENTO, row.id.to_string());
    let older = if config.transitions.is_empty() {
        None
    } else {
        config
            .transitions
            .older_copy(&row.kind, row.version, &row.payload.to_value())
    };
    let Some((version, datos)) = older else {
        batch.push(OutgoingMessage {
            topic,
            key: Some(row.aggregate_id.clone()),
            headers: cloudevents(config, headers, row),
            payload: row.envelope_bytes(&config.source),
        });
        return Ok(());
    };
    let listed = format!("{version},{}", row.version);
    let headers = headers.with(transition::VERSIONS, listed);
    let copy = OutboxRow {
        version,
        payload: RawJson::from_value(&datos),
        ..row.clone()
    };
    for (row, headers) in [(&copy, headers.clone()), (row, headers)] {
        batch.push(OutgoingMessage {
            topic: topic.clone(),
            key: Some(row.aggregate_id.clone()),
            headers: cloudevents(config, headers, row),
            payload: row.envelope_bytes(&config.source),
        });
    }
    Ok(())
}

/// `headers` with `row`'s CloudEvents attributes, when the relay writes them.
fn cloudevents(config: &RelayConfig, headers: Headers, row: &OutboxRow) -> Headers {
    match &config.cloudevents {
        Some(binding) => binding.apply(
            headers,
            (&row.id.to_string(), &row.kind, row.version),
            &config.source,
            row.created_at_ms,
        ),
        None => headers,
    }
}
