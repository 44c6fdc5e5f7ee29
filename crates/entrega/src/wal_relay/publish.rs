//! Publishing a batch of rows read from the stream or the snapshot, as the polling relay
//! would publish them.

use std::sync::Arc;

use entrega_core::{OutboxRow, OutgoingMessage, Publisher, TransportError};

use crate::failpoint;
use crate::relay::wire;
use crate::relay_config::{bump, RelayConfig, RelayStats};

/// The messages of `rows`, in order.
pub(super) fn messages(
    config: &RelayConfig,
    rows: &[OutboxRow],
) -> Result<Vec<OutgoingMessage>, TransportError> {
    let mut batch = Vec::with_capacity(rows.len());
    for row in rows {
        wire::messages(config, row, &mut batch)?;
    }
    Ok(batch)
}

/// Publishes `batch` in one call through the relay's failpoints; `Ok` only once the transport
/// confirmed all of it.
pub(super) async fn publish(
    publisher: Arc<dyn Publisher>,
    stats: Arc<RelayStats>,
    batch: Arc<Vec<OutgoingMessage>>,
) -> Result<(), TransportError> {
    failpoint::hit(failpoint::RELAY_BEFORE_PUBLISH).map_err(unavailable)?;
    let started = std::time::Instant::now();
    let published = publisher.publish(&batch).await;
    metrics::histogram!(crate::metrics::RELAY_PUBLISH_SECONDS)
        .record(started.elapsed().as_secs_f64());
    if let Err(e) = published {
        bump(&stats.publish_errors, 1);
        return Err(e);
    }
    failpoint::hit(failpoint::RELAY_AFTER_PUBLISH).map_err(unavailable)?;
    Ok(())
}

/// A failpoint set to `error` fails the step as a broker away would.
pub(super) fn unavailable(e: failpoint::FailpointError) -> TransportError {
    TransportError::unavailable(e.to_string())
}
