//! The metrics entrega records through the [`metrics`](https://docs.rs/metrics) facade. They
//! cost nothing until the application installs a recorder (km0 installs a Prometheus one for
//! its `--ops` endpoint); the names follow Prometheus' conventions.

/// Histogram, seconds: how long each relay publish took, from the call to the transport's
/// confirmation of every message in it (a publish carries a round of rows).
pub const RELAY_PUBLISH_SECONDS: &str = "entrega_relay_publish_duration_seconds";

/// Histogram, seconds, label `group`: how long each handler call of a worker took (one call
/// handles a batch of records of one handler, up to the poll's size).
pub const HANDLER_SECONDS: &str = "entrega_handler_duration_seconds";
