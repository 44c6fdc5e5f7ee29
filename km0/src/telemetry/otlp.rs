//! An OpenTelemetry exporter of traced spans, over OTLP/HTTP with JSON bodies
//! (<https://opentelemetry.io/docs/specs/otlp/#otlphttp>): `POST <endpoint>/v1/traces`.
//!
//! Only spans that name a trace are exported: those with the fields `trace_id` and `span_id`
//! ([`entrega::trace`]: an HTTP request, a consumed message, an answered request). Their ids
//! are the ones propagated in `traceparent`, so spans of every process line up in one trace.
//! The other fields become attributes; `otel.name` names the span and `otel.kind` sets its
//! kind. Spans wait in a bounded queue and are sent in batches every [`FLUSH_EVERY`]; when
//! the collector is down or slow and the queue is full, further spans are dropped and counted
//! (`km0_otlp_spans_dropped_total`), never blocking the work they describe.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Longest a finished span waits before it is sent.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// Most spans in one request to the collector.
const BATCH: usize = 512;
/// Finished spans held while the collector is slow; more are dropped.
const QUEUE: usize = 8192;
/// Longest one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Spans sent to the collector.
pub const SPANS_EXPORTED: &str = "km0_otlp_spans_exported_total";
/// Spans dropped: the queue was full, or the collector refused or could not be reached.
pub const SPANS_DROPPED: &str = "km0_otlp_spans_dropped_total";

/// A finished span, as exported.
#[derive(Debug, Clone, PartialEq)]
struct Finished {
    name: String,
    kind: u8,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    start_ns: u128,
    end_ns: u128,
    attributes: BTreeMap<String, Attr>,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
enum Attr {
    Text(String),
    Int(i64),
    Bool(bool),
}

/// What a traced span has recorded while open (kept in the span's extensions).
#[derive(Debug, Default)]
struct Fields(BTreeMap<String, Attr>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Attr::Text(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Attr::Text(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Attr::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        self.0.insert(field.name().to_owned(), Attr::Int(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Attr::Bool(value));
    }
}

/// An open traced span: when it started and its fields so far.
#[derive(Debug)]
struct Open {
    name: &'static str,
    start_ns: u128,
    fields: Fields,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The `tracing` layer that hands finished traced spans to the exporter task.
#[derive(Debug, Clone)]
pub struct OtlpLayer {
    spans: mpsc::Sender<Finished>,
}

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if !(fields.0.contains_key("trace_id") && fields.0.contains_key("span_id")) {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Open {
                name: attrs.metadata().name(),
                start_ns: now_ns(),
                fields,
            });
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(open) = span.extensions_mut().get_mut::<Open>() {
                values.record(&mut open.fields);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        let finished = finish(open, now_ns());
        if self.spans.try_send(finished).is_err() {
            metrics::counter!(SPANS_DROPPED).increment(1);
        }
    }
}

fn finish(open: Open, end_ns: u128) -> Finished {
    let mut attributes = open.fields.0;
    let mut take = |key: &str| match attributes.remove(key) {
        Some(Attr::Text(v)) => v,
        Some(Attr::Int(v)) => v.to_string(),
        Some(Attr::Bool(v)) => v.to_string(),
        None => String::new(),
    };
    let trace_id = take("trace_id");
    let span_id = take("span_id");
    let parent_span_id = take("parent_span_id");
    let name = Some(take("otel.name"))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| open.name.to_owned());
    // OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer.
    let kind = match take("otel.kind").as_str() {
        "server" => 2,
        "client" => 3,
        "producer" => 4,
        "consumer" => 5,
        _ => 1,
    };
    Finished {
        name,
        kind,
        trace_id,
        span_id,
        parent_span_id,
        start_ns: open.start_ns,
        end_ns,
        attributes,
    }
}

/// Flushes the spans still queued, for a clean shutdown.
#[derive(Debug, Clone)]
pub struct OtlpHandle {
    flush: mpsc::Sender<oneshot::Sender<()>>,
}

impl OtlpHandle {
    /// Sends every span finished so far, waiting at most `limit`.
    pub async fn flush(&self, limit: Duration) {
        let (done, wait) = oneshot::channel();
        if self.flush.send(done).await.is_ok() {
            let _ = tokio::time::timeout(limit, wait).await;
        }
    }
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("OTLP endpoint `{0}` must be an http:// URL, e.g. http://127.0.0.1:4318")]
    Endpoint(String),
    /// The HTTP client could not be built.
    #[error("OTLP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The layer for a subscriber and the handle to flush it, exporting as `service` to
/// `endpoint` (the collector's base URL; `/v1/traces` is added unless it is there). Spawns
/// the exporter on the current tokio runtime.
pub fn layer(endpoint: &str, service: &str) -> Result<(OtlpLayer, OtlpHandle), OtlpError> {
    let endpoint = endpoint.trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(OtlpError::Endpoint(endpoint.to_owned()));
    }
    let url = if endpoint.ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{endpoint}/v1/traces")
    };
    let http = reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build()?;
    let (spans_tx, spans) = mpsc::channel(QUEUE);
    let (flush_tx, flushes) = mpsc::channel(4);
    let exporter = Exporter {
        http,
        url,
        service: service.to_owned(),
    };
    tokio::spawn(exporter.run(spans, flushes));
    Ok((
        OtlpLayer { spans: spans_tx },
        OtlpHandle { flush: flush_tx },
    ))
}

struct Exporter {
    http: reqwest::Client,
    url: String,
    service: String,
}

impl Exporter {
    async fn run(
        self,
        mut spans: mpsc::Receiver<Finished>,
        mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        loop {
            tokio::select! {
                span = spans.recv() => match span {
                    Some(span) => {
                        batch.push(span);
                        if batch.len() >= BATCH {
                            self.send(&mut batch).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => self.send(&mut batch).await,
                Some(done) = flushes.recv() => {
                    while let Ok(span) = spans.try_recv() {
                        batch.push(span);
                        if batch.len() >= BATCH {
                            self.send(&mut batch).await;
                        }
                    }
                    self.send(&mut batch).await;
                    let _ = done.send(());
                }
            }
        }
        self.send(&mut batch).await;
    }

    async fn send(&self, batch: &mut Vec<Finished>) {
        if batch.is_empty() {
            return;
        }
        let count = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let body = export_request(&self.service, batch);
        batch.clear();
        let sent = self.http.post(&self.url).json(&body).send().await;
        match sent {
            Ok(response) if response.status().is_success() => {
                metrics::counter!(SPANS_EXPORTED).increment(count);
            }
            Ok(response) => {
                metrics::counter!(SPANS_DROPPED).increment(count);
                tracing::warn!(status = %response.status(), spans = count, "the OTLP collector refused spans");
            }
            Err(e) => {
                metrics::counter!(SPANS_DROPPED).increment(count);
                tracing::warn!(error = %e, spans = count, "spans could not reach the OTLP collector");
            }
        }
    }
}

/// The body of an `ExportTraceServiceRequest` in OTLP's JSON encoding (ids in hex, times as
/// decimal strings of nanoseconds).
fn export_request(service: &str, spans: &[Finished]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let attributes: Vec<Value> = s
                .attributes
                .iter()
                .map(|(key, value)| {
                    let value = match value {
                        Attr::Text(v) => json!({ "stringValue": v }),
                        Attr::Int(v) => json!({ "intValue": v.to_string() }),
                        Attr::Bool(v) => json!({ "boolValue": v }),
                    };
                    json!({ "key": key, "value": value })
                })
                .collect();
            json!({
                "traceId": s.trace_id,
                "spanId": s.span_id,
                "parentSpanId": s.parent_span_id,
                "name": s.name,
                "kind": s.kind,
                "startTimeUnixNano": s.start_ns.to_string(),
                "endTimeUnixNano": s.end_ns.to_string(),
                "attributes": attributes,
            })
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [
                { "key": "service.name", "value": { "stringValue": service } },
            ]},
            "scopeSpans": [{
                "scope": { "name": "km0", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[tokio::test]
    async fn only_traced_spans_are_exported_with_their_ids_and_fields() {
        let (tx, mut rx) = mpsc::channel(16);
        let subscriber = tracing_subscriber::registry().with(OtlpLayer { spans: tx });
        tracing::subscriber::with_default(subscriber, || {
            let _untraced = tracing::info_span!("plain", n = 1).entered();
            let span = tracing::info_span!(
                "consume",
                otel.name = "consume pedido.creado",
                otel.kind = "consumer",
                trace_id = "4bf92f3577b34da6a3ce929d0e0e4736",
                span_id = "00f067aa0ba902b7",
                parent_span_id = "",
                partition = 3u32,
                status = tracing::field::Empty,
            );
            span.record("status", "ok");
            drop(span);
        });
        let span = rx.try_recv().unwrap();
        assert!(rx.try_recv().is_err(), "the untraced span is not exported");
        assert_eq!(span.name, "consume pedido.creado");
        assert_eq!(span.kind, 5);
        assert_eq!(span.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.span_id, "00f067aa0ba902b7");
        assert_eq!(span.parent_span_id, "");
        assert!(span.end_ns >= span.start_ns);
        assert_eq!(span.attributes.get("partition"), Some(&Attr::Int(3)));
        assert_eq!(
            span.attributes.get("status"),
            Some(&Attr::Text("ok".into()))
        );

        let body = export_request("km0 inventario", &[span]);
        let resource = &body["resourceSpans"][0];
        assert_eq!(
            resource["resource"]["attributes"][0]["value"]["stringValue"],
            "km0 inventario"
        );
        let exported = &resource["scopeSpans"][0]["spans"][0];
        assert_eq!(exported["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(exported["kind"], 5);
        assert!(exported["startTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u128>()
            .is_ok());
    }

    #[test]
    fn an_endpoint_must_be_http() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _guard = rt.enter();
        assert!(matches!(
            layer("127.0.0.1:4318", "km0"),
            Err(OtlpError::Endpoint(_))
        ));
        assert!(layer("http://127.0.0.1:4318/", "km0").is_ok());
    }
}
