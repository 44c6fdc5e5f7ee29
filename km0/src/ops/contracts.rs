//! `km0 contracts`: km0's event contracts against the committed ones under `contracts/`
//! (ADR 0019). `check` is what CI runs; `update` records new contracts and compatible changes,
//! and refuses a change that breaks its channel's policy; `list` shows every contract;
//! `asyncapi` writes the AsyncAPI description generated from them; `register` puts them in a
//! schema registry with the Confluent API, `check --registry` asks one whether the code's
//! contracts are compatible with what it holds.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use entrega::contracts::{Directory, Finding};

use crate::contracts::registry::{RegistryError, SchemaRegistry};

/// Where the contracts are and what to do with them.
#[derive(Debug, Args)]
pub struct ContractsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ContractsCommand,
    /// The committed contracts (one file per tipo and version).
    #[arg(long, global = true, default_value = crate::contracts::DIRECTORY)]
    pub dir: PathBuf,
}

/// The `km0 contracts` subcommands.
#[derive(Debug, Subcommand)]
pub enum ContractsCommand {
    /// Compares the code's contracts with the committed ones; exits 1 on any difference.
    /// With `--registry`, also asks the schema registry whether each is compatible with what
    /// it holds, under its subject's level; exits 1 on any that is not.
    Check {
        /// A schema registry with the Confluent API (Apicurio: `.../apis/ccompat/v7`).
        #[arg(long, env = "KM0_SCHEMA_REGISTRY")]
        registry: Option<String>,
        /// Prefix of every subject in the registry.
        #[arg(long, env = "KM0_SCHEMA_REGISTRY_PREFIX", default_value = "")]
        subject_prefix: String,
    },
    /// Registers every contract in a schema registry with the Confluent API: one subject per
    /// tipo and version, its level the channel's policy. Exits 1 when the registry refuses one
    /// as incompatible.
    Register {
        /// The registry (Apicurio: `http://HOST:PORT/apis/ccompat/v7`).
        #[arg(long, env = "KM0_SCHEMA_REGISTRY")]
        registry: String,
        /// Prefix of every subject in the registry.
        #[arg(long, env = "KM0_SCHEMA_REGISTRY_PREFIX", default_value = "")]
        subject_prefix: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Writes new contracts and compatible changes; refuses (exit 1) if any change breaks its
    /// channel's compatibility policy, writing nothing.
    Update,
    /// Every contract: tipo, version, channel and policy.
    List,
    /// The OpenAPI 3.1 description of an HTTP API (JSON), generated from its handlers;
    /// committed under `docs/` and served by the API at `/openapi.json`.
    Openapi {
        /// Which API: `pedidos` (committed as `docs/openapi.json`), `pasarela` (the gateway
        /// simulator, `docs/openapi-pasarela.json`) or `operations` (the `--ops` endpoint and
        /// its web console, `docs/openapi-operations.json`).
        #[arg(long, default_value = "pedidos")]
        api: String,
        /// Write it to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// km0's AsyncAPI 3.0 document (YAML), generated from the contracts; committed as
    /// `docs/asyncapi.yaml`.
    Asyncapi {
        /// Write it to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs a `km0 contracts` subcommand.
pub async fn run(args: &ContractsArgs) -> anyhow::Result<ExitCode> {
    let catalog = crate::contracts::catalog();
    let directory = Directory::new(&args.dir);
    match &args.command {
        ContractsCommand::Asyncapi { out } => {
            let text = entrega::contracts::to_yaml(&crate::contracts::asyncapi());
            match out {
                Some(path) => std::fs::write(path, text)?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        ContractsCommand::Openapi { api, out } => {
            let Some(text) = crate::contracts::openapi_json(api) else {
                anyhow::bail!("no HTTP API `{api}` (known: pedidos, pasarela, operations)");
            };
            match out {
                Some(path) => std::fs::write(path, text)?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        ContractsCommand::List => {
            for c in catalog.contracts() {
                let policy = catalog.policy_of(&c.channel);
                println!(
                    "{:<32} v{:<3} {:<24} {policy}",
                    c.tipo, c.version, c.channel
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ContractsCommand::Register {
            registry,
            subject_prefix,
            json,
        } => {
            let registry = SchemaRegistry::new(registry)?.with_prefix(subject_prefix);
            match registry.register(&catalog).await {
                Ok(done) => {
                    if *json {
                        println!("{}", serde_json::to_string_pretty(&done)?);
                    } else {
                        for r in &done {
                            let what = if r.new { "registered" } else { "already there" };
                            println!("{:<44} id {:<5} {:<20} {what}", r.subject, r.id, r.level);
                        }
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e @ RegistryError::Incompatible { .. }) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
                Err(e) => Err(e.into()),
            }
        }
        ContractsCommand::Check {
            registry,
            subject_prefix,
        } => {
            if let Some(url) = registry {
                let registry = SchemaRegistry::new(url)?.with_prefix(subject_prefix);
                let mut refused = 0;
                for c in catalog.contracts() {
                    if !registry.compatible(&c.tipo, c.version, &c.schema).await? {
                        refused += 1;
                        eprintln!(
                            "{url}: `{}` is not compatible with what the registry holds under {}",
                            registry.subject(&c.tipo, c.version),
                            catalog.policy_of(&c.channel)
                        );
                    }
                }
                if refused > 0 {
                    return Ok(ExitCode::FAILURE);
                }
                println!("the schema registry accepts every contract");
            }
            let findings = directory.check(&catalog)?;
            report(&findings, &args.dir);
            if findings.is_empty() {
                println!(
                    "{} contracts match {}",
                    catalog.contracts().count(),
                    args.dir.display()
                );
                Ok(ExitCode::SUCCESS)
            } else {
                if findings.iter().all(Finding::is_update) {
                    eprintln!(
                        "run `km0 contracts update` and commit {}",
                        args.dir.display()
                    );
                }
                Ok(ExitCode::FAILURE)
            }
        }
        ContractsCommand::Update => match directory.update(&catalog)? {
            Ok(written) => {
                for finding in &written {
                    println!("written: {finding}");
                }
                println!("{} contract file(s) written", written.len());
                Ok(ExitCode::SUCCESS)
            }
            Err(findings) => {
                report(&findings, &args.dir);
                eprintln!("nothing written");
                Ok(ExitCode::FAILURE)
            }
        },
    }
}

fn report(findings: &[Finding], dir: &std::path::Path) {
    for finding in findings {
        eprintln!("{}: {finding}", dir.display());
    }
}
