//! The `km0` binary: parses the command line and hands over to [`km0::cli::run`].

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,km0=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match km0::cli::run(km0::cli::Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("km0: {e:#}");
            ExitCode::FAILURE
        }
    }
}
