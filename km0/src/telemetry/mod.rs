//! Traces and their export: the HTTP side of W3C trace context (incoming requests continue
//! the caller's trace, outgoing calls carry ours) and the export of the spans that name a
//! trace through the OpenTelemetry SDK (OTLP). Propagation through the outbox, the broker and the
//! consumers is entrega's ([`entrega::trace`]).

pub mod http;
pub mod log_fields;
pub mod otel;
