//! The `km0` binary: parses the command line and hands over to [`km0::cli::run`].

use std::process::ExitCode;

use clap::Parser as _;

/// mimalloc instead of the system allocator: a relay or consumer allocates and frees on one
/// thread what librdkafka's and tokio's other threads made, where glibc's malloc spent about a
/// quarter of the relay's CPU consolidating and unlinking chunks (`perf`, see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = km0::cli::Cli::parse();
    // The demo prints its own progress and report; services log what they do.
    let default_filter = match cli.command {
        km0::cli::Command::Demo(_) | km0::cli::Command::Bench(_) => "warn",
        _ => "warn,km0=info,entrega=info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match km0::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("km0: {e:#}");
            ExitCode::FAILURE
        }
    }
}
