//! The metrics entrega records through the [`metrics`](https://docs.rs/metrics) facade. They
//! cost nothing until the application installs a recorder (km0 installs a Prometheus one for
//! its `--ops` endpoint); the names follow Prometheus' conventions.

/// Histogram, seconds: how long each relay publish took, from the call to the transport's
/// confirmation of every message in it (a publish carries a round of rows).
pub const RELAY_PUBLISH_SECONDS: &str = "entrega_relay_publish_duration_seconds";

/// Histogram, seconds, label `group`: how long each handler call of a worker took (one call
/// handles a batch of records of one handler, up to the poll's size).
pub const HANDLER_SECONDS: &str = "entrega_handler_duration_seconds";

/// Counter, label `outcome` (`answered`, `timed_out`): calls an RPC client made, by how they
/// ended.
pub const RPC_CALLS: &str = "entrega_rpc_client_calls_total";

/// Counter: replies an RPC client received for no call in flight (after its timeout, or
/// twice), discarded.
pub const RPC_LATE_REPLIES: &str = "entrega_rpc_client_late_replies_total";

/// Counter, label `outcome` (`answered`, `failed`, `undeliverable`, `retried`): requests an
/// RPC server settled, by how.
pub const RPC_SERVED: &str = "entrega_rpc_server_requests_total";

/// Counter: records a consumer group dead-lettered, labelled `group`, `class` (a
/// [`entrega_core::DeadClass`] name) and `reason` (the handler's code, or the class name when
/// it gave none).
pub const DEAD_LETTERS: &str = "entrega_dead_letters_total";

/// Counter, label `group`: dead letters the broker refused, held in the consumer's database
/// (`entrega_held_letters`) for an operator to send on.
pub const HELD_LETTERS: &str = "entrega_dead_letters_held_total";

/// Counts one held dead letter of `group`.
pub(crate) fn held_letter(group: &str) {
    metrics::counter!(HELD_LETTERS, "group" => group.to_owned()).increment(1);
}

/// Counter, label `group`: records carrying `entrega-only-group` without a signature the
/// group's replay key verifies; each was handled as an ordinary record.
pub const UNSIGNED_ONLY_GROUP: &str = "entrega_only_group_unsigned_total";

/// Counts one record of `group` whose `entrega-only-group` did not verify.
pub(crate) fn unsigned_only_group(group: &str) {
    metrics::counter!(UNSIGNED_ONLY_GROUP, "group" => group.to_owned()).increment(1);
}

/// Counts one dead letter of `group`.
pub(crate) fn dead_letter(group: &str, reason: &entrega_core::DeadReason) {
    metrics::counter!(
        DEAD_LETTERS,
        "group" => group.to_owned(),
        "class" => reason.class.as_str(),
        "reason" => reason.counted_as().to_owned()
    )
    .increment(1);
}

/// Adds one to counter `name` with label `outcome`.
pub(crate) fn outcome(name: &'static str, outcome: &'static str) {
    metrics::counter!(name, "outcome" => outcome).increment(1);
}

/// Gauge, bytes, label `slot`: WAL a WAL relay's replication slot keeps from being removed
/// (from its `restart_lsn` to the server's current position).
pub const WAL_SLOT_RETAINED_BYTES: &str = "entrega_wal_slot_retained_bytes";

/// Gauge, bytes, label `slot`: WAL written past the position the WAL relay confirmed.
pub const WAL_SLOT_LAG_BYTES: &str = "entrega_wal_slot_lag_bytes";

/// Gauge, seconds, label `slot`: how long ago the oldest transaction the WAL relay read and
/// has not confirmed committed; 0 when it is caught up.
pub const WAL_SLOT_LAG_SECONDS: &str = "entrega_wal_slot_lag_seconds";

/// Gauge, label `slot`: 1 while this process streams from the slot, 0 while it waits (another
/// relay holds it, or it reconnects).
pub const WAL_RELAY_STREAMING: &str = "entrega_wal_relay_streaming";

/// Gauge, label `slot`: 1 when the slot is missing or PostgreSQL invalidated it
/// (`wal_status = lost`); the WAL relay then stops for an operator.
pub const WAL_SLOT_LOST: &str = "entrega_wal_slot_lost";

/// Sets the WAL relay's gauges of `slot`.
pub(crate) fn wal_slot(slot: &str, gauges: &crate::wal_relay::SlotGauges) {
    let label = || ("slot", slot.to_owned());
    metrics::gauge!(WAL_SLOT_RETAINED_BYTES, &[label()]).set(gauges.retained_bytes() as f64);
    metrics::gauge!(WAL_SLOT_LAG_BYTES, &[label()]).set(gauges.lag_bytes() as f64);
    metrics::gauge!(WAL_SLOT_LAG_SECONDS, &[label()]).set(gauges.lag_seconds());
    metrics::gauge!(WAL_RELAY_STREAMING, &[label()]).set(f64::from(u8::from(gauges.streaming())));
    metrics::gauge!(WAL_SLOT_LOST, &[label()]).set(f64::from(u8::from(gauges.lost())));
}

/// Gives every metric above its `# HELP` text and unit on the installed recorder: call it
/// once after installing one (a recorder installed later has no descriptions).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        RELAY_PUBLISH_SECONDS,
        Unit::Seconds,
        "How long each relay publish took, to the broker's confirmation of every message in it."
    );
    describe_histogram!(
        HANDLER_SECONDS,
        Unit::Seconds,
        "How long each handler call of a consumer group's worker took (one call, one batch)."
    );
    describe_counter!(
        RPC_CALLS,
        "Calls an RPC client made, by how they ended (answered, timed_out)."
    );
    describe_counter!(
        RPC_LATE_REPLIES,
        "Replies an RPC client received for no call in flight (late or twice), discarded."
    );
    describe_counter!(
        RPC_SERVED,
        "Requests an RPC server settled, by how (answered, failed, undeliverable, retried)."
    );
    describe_counter!(
        DEAD_LETTERS,
        "Records a consumer group dead-lettered, by class and reason."
    );
    describe_counter!(
        HELD_LETTERS,
        "Dead letters the broker refused, held in the consumer's database for an operator."
    );
    describe_counter!(
        UNSIGNED_ONLY_GROUP,
        "Records whose entrega-only-group did not verify, handled as ordinary records."
    );
    describe_gauge!(
        WAL_SLOT_RETAINED_BYTES,
        Unit::Bytes,
        "WAL the WAL relay's replication slot keeps from being removed."
    );
    describe_gauge!(
        WAL_SLOT_LAG_BYTES,
        Unit::Bytes,
        "WAL written past the position the WAL relay confirmed."
    );
    describe_gauge!(
        WAL_SLOT_LAG_SECONDS,
        Unit::Seconds,
        "Age of the oldest transaction the WAL relay read and has not confirmed; 0 when caught up."
    );
    describe_gauge!(
        WAL_RELAY_STREAMING,
        "1 while this process streams from the replication slot, 0 while it waits."
    );
    describe_gauge!(
        WAL_SLOT_LOST,
        "1 when the WAL relay's replication slot is missing or invalidated (wal_status = lost)."
    );
}
