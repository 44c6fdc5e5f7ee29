//! The command line of `km0 dlq`.

use clap::{Args, Subcommand};
use entrega::dlq::{DlqFilter, DEFAULT_MAX_REPLAYS};
use entrega_core::{now_ms, DeadClass, DeadLetterId};

use super::time::{parse_time, InvalidTime};

/// `km0 dlq ...`: tend the dead letters of km0's topics (`pedidos.eventos.dlq`).
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead letters with topic, partition and offset, key, tipo, reason, attempts; pending
    /// only unless `--all`.
    List {
        /// Which dead letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Show replayed and discarded ones too, with their state.
        #[arg(long)]
        all: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Counts per dead-letter topic and reason (and reason class) by state, and the depth of
    /// the retry topic: what alerts are built on.
    Stats {
        /// Which dead letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Subtract this group's committed offsets from the retry topic's depth.
        #[arg(long)]
        group: Option<String>,
        /// Print JSON (stable shape, see docs/OPERATIONS.md).
        #[arg(long)]
        json: bool,
    },
    /// One dead letter: envelope, headers, attempts, replays, state, and the other dead
    /// letters of the same event (its history).
    Show {
        /// The dead letter: `<dlq-topic>/<partition>/<offset>`, as `list` prints it.
        id: DeadLetterId,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Publishes pending dead letters again to their origin topic, in order per key.
    Replay {
        /// Which dead letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Print what would be replayed; publish and mark nothing (audited as a dry run).
        #[arg(long)]
        dry_run: bool,
        /// Refuse dead letters already replayed this many times.
        #[arg(long, default_value_t = DEFAULT_MAX_REPLAYS)]
        max_replays: u32,
        /// Deliver to this consumer group only (other groups acknowledge without handling).
        #[arg(long)]
        group: Option<String>,
        /// Act only on the very dead letters a dry run listed: the `selection` it printed
        /// (refused, doing nothing, if the filter selects others now).
        #[arg(long, value_name = "SELECTION")]
        expect: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sets pending dead letters aside for good, with a reason.
    Discard {
        /// Which dead letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Why (kept with each dead letter and in the audit).
        #[arg(long, required = true)]
        reason: String,
        /// Print what would be discarded; mark nothing (audited as a dry run).
        #[arg(long)]
        dry_run: bool,
        /// Act only on the very dead letters a dry run listed; see `replay --expect`.
        #[arg(long, value_name = "SELECTION")]
        expect: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Dead letters the broker refused (too large, topic missing), held in each consumer's
    /// database so its partition went on.
    Held {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Publishes the held dead letters to their dead-letter topics once the cause is mended;
    /// each one the broker takes is forgotten, each one it refuses stays held.
    SendHeld {
        /// Only this service's consumers: pedidos, inventario, pagos, reparto, catalogo.
        #[arg(long, value_parser = parse_service)]
        service: Option<&'static crate::wiring::Database>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The latest operator actions on dead letters.
    Audit {
        /// How many, newest first.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Which dead letters: filters combine; `--id` combines with none of them.
#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// Exactly this dead letter (repeat for several): `<dlq-topic>/<partition>/<offset>`.
    #[arg(long = "id")]
    pub ids: Vec<DeadLetterId>,
    /// Only this topic's dead letters: `pedidos.eventos` or `pedidos.eventos.dlq`.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this event type (`tipo`), exactly.
    #[arg(long = "type", alias = "tipo", id = "tipo")]
    pub kind: Option<String>,
    /// Only reasons (`motivo`) containing this text (any case).
    #[arg(long = "reason-contains", alias = "motivo", id = "motivo")]
    pub reason: Option<String>,
    /// Only this kind of failure: ilegible, tipo_desconocido, rechazado, agotado,
    /// cabeceras_invalidas.
    #[arg(long = "class", alias = "clase", id = "class", value_parser = parse_class)]
    pub failure: Option<DeadClass>,
    /// Only dead letters written at or after: epoch ms, an age (30m, 2h, 1d) or UTC time.
    #[arg(long)]
    pub since: Option<String>,
    /// Only dead letters written at or before: epoch ms, an age (30m, 2h, 1d) or UTC time.
    #[arg(long)]
    pub until: Option<String>,
}

impl FilterArgs {
    /// The library's filter; a topic is taken as its dead-letter topic.
    pub fn to_filter(&self) -> Result<DlqFilter, InvalidTime> {
        let now = now_ms();
        let time = |t: &Option<String>| t.as_deref().map(|t| parse_time(t, now)).transpose();
        let mut filter = DlqFilter::all().with_time(time(&self.since)?, time(&self.until)?);
        filter.ids = self.ids.clone();
        if let Some(topic) = &self.topic {
            filter = filter.with_topic(if topic.ends_with(".dlq") {
                topic.clone()
            } else {
                format!("{topic}.dlq")
            });
        }
        if let Some(kind) = &self.kind {
            filter = filter.with_kind(kind.clone());
        }
        if let Some(reason) = &self.reason {
            filter = filter.with_reason(reason.clone());
        }
        if let Some(class) = self.failure {
            filter = filter.with_failure(class);
        }
        Ok(filter)
    }
}

fn parse_class(name: &str) -> Result<DeadClass, String> {
    DeadClass::parse(name).ok_or_else(|| {
        let names: Vec<&str> = DeadClass::ALL.iter().map(|c| c.as_str()).collect();
        format!("unknown class `{name}`; one of {}", names.join(", "))
    })
}

fn parse_service(name: &str) -> Result<&'static crate::wiring::Database, String> {
    super::held::consumers()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| format!("unknown service `{name}`"))
}
