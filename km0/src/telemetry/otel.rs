//! Spans exported through the OpenTelemetry SDK (`tracing-opentelemetry` and
//! `opentelemetry-otlp`; docs/adr/0020-opentelemetry-sdk.md).
//!
//! Exported are the spans that stand for a hop of a trace, those with an `otel.kind`: an HTTP
//! request ([`super::http::traced`]), a consumed message and an answered request
//! ([`entrega::trace`]). Each hop's ids are the SDK's: [`span_ids`], installed as entrega's
//! hook, makes the caller's `traceparent` the span's parent and reads back the ids the SDK
//! drew and the sampler's decision, so every event the hop enqueues names a span the collector
//! receives, and an unsampled trace stays unsampled downstream.
//!
//! The OpenTelemetry environment is honoured: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as
//! given), `OTEL_EXPORTER_OTLP_ENDPOINT` (the flag's variable; `/v1/traces` added for HTTP),
//! `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`, `_HEADERS`, `_TIMEOUT`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*` and
//! `OTEL_SDK_DISABLED`. Finished spans wait in the SDK's bounded queue and leave in batches
//! from its own thread; a collector that is down or slow never blocks the work the spans
//! describe (a full queue drops spans, which the SDK logs).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use entrega::TraceContext;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_opentelemetry::{OpenTelemetrySpanExt as _, SetParentError};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Spans the collector accepted.
pub const SPANS_EXPORTED: &str = "km0_otlp_spans_exported_total";
/// Spans of exports that failed (collector refusing or unreachable after the SDK's retries).
pub const SPANS_DROPPED: &str = "km0_otlp_spans_dropped_total";

/// Longest a finished span waits before it is sent, unless `OTEL_BSP_SCHEDULE_DELAY` says.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// Finished spans held while the collector is slow, unless `OTEL_BSP_MAX_QUEUE_SIZE` says.
const QUEUE: usize = 8192;
/// Longest one export may take, unless `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` says (ms).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The export deadline the SDK applies, which the HTTP client's own timeout follows.
fn export_timeout() -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok()?.trim().parse::<u64>().ok())
    .map_or(EXPORT_TIMEOUT, Duration::from_millis)
}

/// How spans reach the collector (`--otlp-protocol`, OpenTelemetry's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (OpenTelemetry's default).
    #[default]
    #[value(name = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies.
    #[value(name = "http/json")]
    HttpJson,
    /// OTLP/gRPC (built with the `otlp-grpc` feature).
    #[value(name = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The protocol named by `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, which wins over the generic
    /// variable and the flag, as the specification orders them; `given` otherwise.
    fn resolved(given: Self) -> Result<Self, OtelError> {
        match std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Ok(name) if !name.trim().is_empty() => {
                <Self as clap::ValueEnum>::from_str(name.trim(), true)
                    .map_err(|_| OtelError::Protocol(name))
            }
            _ => Ok(given),
        }
    }
}

/// What to export and where.
#[derive(Debug, Clone)]
pub struct OtelConfig {
    /// The collector's base URL (`--otlp-endpoint`), if given.
    pub endpoint: Option<String>,
    /// How to reach it.
    pub protocol: OtlpProtocol,
    /// `service.name` of every span.
    pub service: String,
}

impl OtelConfig {
    /// Whether spans are to be exported: an endpoint given by the flag, its variable or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, and `OTEL_SDK_DISABLED` not `true`.
    pub fn enabled(&self) -> bool {
        let disabled =
            std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        !disabled && (self.endpoint.is_some() || traces_endpoint_from_env().is_some())
    }
}

fn traces_endpoint_from_env() -> Option<String> {
    std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("OTLP endpoint `{0}` must be an http:// or https:// URL, e.g. http://127.0.0.1:4318")]
    Endpoint(String),
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` names no protocol km0 speaks.
    #[error("OTLP protocol `{0}` is none of http/protobuf, http/json, grpc")]
    Protocol(String),
    /// gRPC asked of a build without it.
    #[error("OTLP over gRPC needs km0 built with the `otlp-grpc` feature; use http/protobuf")]
    GrpcNotBuilt,
    /// The HTTP client could not be built.
    #[error("OTLP client: {0}")]
    Client(#[from] reqwest::Error),
    /// Not called inside a tokio runtime, which the HTTP client runs on.
    #[error("the OTLP exporter needs a tokio runtime to run on")]
    NoRuntime,
    /// The SDK refused the exporter's settings.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// Flushes and stops the exporter at exit.
#[derive(Debug, Clone)]
pub struct OtelHandle {
    provider: SdkTracerProvider,
}

impl OtelHandle {
    /// Sends every span finished so far and stops, waiting at most `limit`.
    pub async fn shutdown(self, limit: Duration) {
        let provider = self.provider;
        let stop = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(limit));
        match tokio::time::timeout(limit + Duration::from_millis(200), stop).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "spans not all exported at exit"),
            Ok(Err(_)) | Err(_) => tracing::warn!("spans not all exported at exit"),
        }
    }
}

/// The layer exporting hop spans as `cfg` says, and the handle that flushes it at exit.
/// Installs [`span_ids`] as entrega's hook. Needs a tokio runtime (the HTTP client runs on
/// it).
pub fn layer<S>(cfg: &OtelConfig) -> Result<(impl Layer<S>, OtelHandle), OtelError>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let provider = provider(cfg, Counted::new(exporter(cfg)?));
    Ok((layer_for(&provider), OtelHandle { provider }))
}

/// A layer handing the hop spans (those with an `otel.kind`) to `provider`, with [`span_ids`]
/// installed as entrega's hook.
pub fn layer_for<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    // A second layer in one process keeps the first hook: it reads the span it is given.
    let _ = entrega::trace::set_span_ids(span_ids);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("km0"))
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_location(false)
        .with_threads(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span() && meta.fields().field("otel.kind").is_some()
        }))
}

/// A provider exporting through `exporter` in batches, as `cfg`'s service; the batches'
/// delay and queue are `OTEL_BSP_*`'s, or [`FLUSH_EVERY`] and 8,192 spans.
pub fn provider<E: SpanExporter + 'static>(cfg: &OtelConfig, exporter: E) -> SdkTracerProvider {
    let mut batch = BatchConfigBuilder::default();
    if std::env::var_os("OTEL_BSP_SCHEDULE_DELAY").is_none() {
        batch = batch.with_scheduled_delay(FLUSH_EVERY);
    }
    if std::env::var_os("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
        batch = batch.with_max_queue_size(QUEUE);
    }
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch.build())
        .build();
    SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            Resource::builder()
                .with_service_name(cfg.service.clone())
                .build(),
        )
        .build()
}

/// The OTLP exporter `cfg` names.
fn exporter(cfg: &OtelConfig) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    let protocol = OtlpProtocol::resolved(cfg.protocol)?;
    let from_env = traces_endpoint_from_env();
    let base = match (&from_env, &cfg.endpoint) {
        (Some(url), _) | (None, Some(url)) => url.trim().trim_end_matches('/').to_owned(),
        (None, None) => return Err(OtelError::Endpoint(String::new())),
    };
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(OtelError::Endpoint(base));
    }
    let built = match protocol {
        OtlpProtocol::Grpc => return grpc_exporter(from_env.is_none().then_some(base)),
        OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => {
            let runtime =
                tokio::runtime::Handle::try_current().map_err(|_| OtelError::NoRuntime)?;
            let client = reqwest::Client::builder()
                .timeout(export_timeout())
                .build()?;
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(TokioReqwest { client, runtime })
                .with_protocol(match protocol {
                    OtlpProtocol::HttpJson => Protocol::HttpJson,
                    _ => Protocol::HttpBinary,
                });
            // The signal's own variable is the SDK's to read (as given); the generic endpoint
            // names the collector, whose traces path is added here.
            if from_env.is_none() {
                let url = if base.ends_with("/v1/traces") {
                    base
                } else {
                    format!("{base}/v1/traces")
                };
                builder = builder.with_endpoint(url);
            }
            builder.build()
        }
    };
    built.map_err(|e| OtelError::Exporter(e.to_string()))
}

#[cfg(feature = "otlp-grpc")]
fn grpc_exporter(endpoint: Option<String>) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_protocol(Protocol::Grpc);
    if let Some(url) = endpoint {
        builder = builder.with_endpoint(url);
    }
    builder
        .build()
        .map_err(|e| OtelError::Exporter(e.to_string()))
}

#[cfg(not(feature = "otlp-grpc"))]
fn grpc_exporter(_endpoint: Option<String>) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    Err(OtelError::GrpcNotBuilt)
}

/// entrega's hook ([`entrega::trace::set_span_ids`]): makes `parent` the parent of `span`'s
/// OpenTelemetry span (or none: a new trace) and answers with the ids the SDK gave it and the
/// sampler's flags. `None` for a span the layer does not export (entrega then draws ids).
pub fn span_ids(span: &tracing::Span, parent: Option<TraceContext>) -> Option<TraceContext> {
    let cx = match parent {
        Some(p) => opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(p.trace_id_bytes()),
            SpanId::from_bytes(p.span_id_bytes()),
            TraceFlags::new(p.flags()),
            true,
            TraceState::NONE,
        )),
        None => opentelemetry::Context::new(),
    };
    match span.set_parent(cx) {
        Ok(()) => {}
        // Its ids are fixed already, most likely in a trace of its own: entrega keeps the
        // caller's trace (`open` takes only ids of it), and this span is exported apart.
        Err(SetParentError::AlreadyStarted) => {
            tracing::warn!(
                "a span was started before its parent was set; it is exported apart from its trace"
            );
        }
        Err(_) => return None,
    }
    let cx = span.context();
    let ids = cx.span().span_context().clone();
    if !ids.is_valid() {
        return None;
    }
    TraceContext::from_ids(
        ids.trace_id().to_bytes(),
        ids.span_id().to_bytes(),
        ids.trace_flags().to_u8(),
    )
}

/// The SDK's log events repeated for every batch a collector refuses or never answers:
/// [`Counted`] says once that exports fail and once that they resume, so a process's log
/// shows an outage, not a line every half second. For a filter on the log layer.
pub fn is_repeated_export_failure(meta: &tracing::Metadata<'_>) -> bool {
    meta.target().starts_with("opentelemetry")
        && matches!(
            meta.name(),
            "BatchSpanProcessor.ExportError"
                | "Export.Failed.Exhausted"
                | "Export.Failed.DeadlineExceeded"
                | "Export.Failed.NonRetryable"
        )
}

/// An exporter that counts what it exported and what failed, and logs when exports start
/// failing and when they resume.
#[derive(Debug)]
pub struct Counted<E> {
    inner: E,
    failing: Arc<AtomicBool>,
}

impl<E> Counted<E> {
    /// Counts what `inner` exports.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            failing: Arc::default(),
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let count = batch.len() as u64;
        let export = self.inner.export(batch);
        let failing = Arc::clone(&self.failing);
        async move {
            let result = export.await;
            match &result {
                Ok(()) => {
                    metrics::counter!(SPANS_EXPORTED).increment(count);
                    if failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("spans reach the collector again");
                    }
                }
                Err(e) => {
                    metrics::counter!(SPANS_DROPPED).increment(count);
                    if !failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            error = %e,
                            "spans cannot be exported; they are dropped and counted in \
                             km0_otlp_spans_dropped_total until the collector answers"
                        );
                    }
                }
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The SDK's HTTP client over the workspace's reqwest: each request runs on the process's
/// tokio runtime, and the SDK's export thread waits for its answer.
struct TokioReqwest {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl fmt::Debug for TokioReqwest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokioReqwest")
    }
}

#[async_trait::async_trait]
impl HttpClient for TokioReqwest {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let call = async move {
            let request = reqwest::Request::try_from(request)?;
            let response = client.execute(request).await?;
            let mut answer = http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            let body = response.bytes().await?;
            Ok::<_, HttpError>(answer.body(body)?)
        };
        self.runtime.spawn(call).await?
    }
}
