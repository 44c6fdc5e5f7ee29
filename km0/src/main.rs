//! The `km0` binary: parses the command line and hands over to [`km0::cli::run`].

use std::process::ExitCode;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// mimalloc instead of the system allocator: under glibc's malloc about a quarter of the
/// relay's CPU went to allocating, freeing and consolidating chunks, under mimalloc about 3%
/// (`perf`, docs/BENCHMARKS.md "The Kafka relay: where its time goes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = km0::cli::Cli::parse_args();
    // The demo, the benches and the lab print their own progress and report; services log
    // what they do.
    let default_filter = match cli.command {
        km0::cli::Command::Demo(_) | km0::cli::Command::Bench(_) => "warn",
        // The lab's faults are on purpose; its ledgers say what they did.
        km0::cli::Command::Lab { .. } => "error",
        _ => "warn,km0=info,entrega=info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if cli.log_json {
        logs.json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed()
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .fmt_fields(km0::telemetry::log_fields::escaped_fields())
            .boxed()
    };
    // Spans are exported whatever the log level: the exporter has a filter of its own.
    let otel = km0::telemetry::otel::OtelConfig {
        endpoint: cli.otlp_endpoint.clone(),
        protocol: cli.otlp_protocol,
        service: cli.service_name(),
    };
    let (otel_layer, otel_handle) = if otel.enabled() {
        match km0::telemetry::otel::layer(&otel) {
            Ok((layer, handle)) => (Some(layer), Some(handle)),
            Err(e) => {
                eprintln!("km0: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        (None, None)
    };
    // rust-rdkafka closes a consumer's queue again when it drops one, and logs the refusal as
    // an error though entrega closed the queue (and left the group) already: the only error
    // that module logs, and never news on a clean shutdown.
    let double_close = tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.target() == "rdkafka::consumer::base_consumer"
            && *meta.level() == tracing::Level::ERROR)
    });
    let export_failures = tracing_subscriber::filter::filter_fn(|meta| {
        !km0::telemetry::otel::is_repeated_export_failure(meta)
    });
    tracing_subscriber::registry()
        .with(
            logs.with_filter(filter)
                .with_filter(double_close)
                .with_filter(export_failures),
        )
        .with(otel_layer.with_filter(tracing_subscriber::EnvFilter::new("km0=info,entrega=info")))
        .init();
    let code = match km0::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("km0: {}", km0::cli::error_report(&e));
            ExitCode::FAILURE
        }
    };
    if let Some(handle) = otel_handle {
        handle.shutdown(std::time::Duration::from_secs(2)).await;
    }
    code
}
