//! `km0 lab`: the failures the seeds describe, made to happen. Each scenario runs a naive
//! variant and the pattern on the same workload with the same injected fault, and reads one
//! ledger per side from the real rows: placed, applied, lost, applied twice, out of order,
//! stuck, and what the fault did. docs/LAB.md reads each one.
//!
//! The naive variants live here only; no service can reach them.

mod auto_commit;
mod brokers;
mod compensation;
mod competing;
mod consumer_crash;
mod dual_write;
mod embedded;
mod gateway;
mod ledger;
mod lock;
mod meaning;
mod outage;
mod pipeline;
mod poison;
mod relay_mark;
mod render;
mod retry_key;
mod retry_place;

use std::path::PathBuf;

use anyhow::bail;
use clap::Subcommand;
use futures::future::BoxFuture;
use serde::Serialize;

pub use brokers::{Brokers, Needs};
pub use ledger::Ledger;

use consumer_crash::Mistake;
use dual_write::Fault;

/// `km0 lab ...`.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// The scenarios, with the seed's section each comes from.
    List {
        /// One JSON object per scenario, in an array.
        #[arg(long)]
        json: bool,
    },
    /// Runs a scenario (or `all`): the naive variant, then the pattern, with the same fault.
    Run {
        /// The scenario's name or number, or `all`.
        scenario: String,
        /// Chooses where the faults land; the same seed gives the same run.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The ledgers as JSON.
        #[arg(long)]
        json: bool,
        /// Where the scenarios on a real broker find it.
        #[command(flatten)]
        brokers: Brokers,
    },
    /// The seed's exercise 1 consumer (auto-commit, no key), run by the lab as a process of
    /// its own so that it can be killed.
    #[command(hide = true)]
    AutoCommitConsumer(auto_commit::ConsumerArgs),
}

/// Which variant of a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The mistake the seed warns about.
    Naive,
    /// The pattern that prevents it.
    Pattern,
}

impl Side {
    /// `naive` or `pattern`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::Pattern => "pattern",
        }
    }
}

/// What one side of a scenario runs with.
#[derive(Debug)]
pub(crate) struct SideRun {
    /// An empty directory of its own, for its SQLite files.
    pub dir: PathBuf,
    /// Chooses where the faults land.
    pub seed: u64,
    /// Which side runs.
    pub side: Side,
    /// Where the real brokers are.
    pub brokers: Brokers,
    /// A prefix of its own for every topic, queue, group and key it makes on a shared server.
    pub namespace: String,
}

/// Runs one side of a scenario.
type Runner = for<'a> fn(&'a SideRun) -> BoxFuture<'a, anyhow::Result<Ledger>>;

/// One failure of the seeds, with its naive variant and its pattern.
#[derive(Serialize)]
pub struct Scenario {
    /// Its number in the list.
    pub number: u32,
    /// Its name on the command line.
    pub name: &'static str,
    /// The seed's section it comes from.
    pub section: &'static str,
    /// What the naive side does.
    pub naive: &'static str,
    /// What the pattern side does.
    pub pattern: &'static str,
    /// Two or three sentences: the fault, what the naive side loses, what the pattern keeps.
    pub explains: &'static str,
    /// What it runs on.
    pub needs: Needs,
    #[serde(skip)]
    run: Runner,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .finish()
    }
}

/// Where a run keeps its files.
#[derive(Debug)]
struct Lab {
    dir: PathBuf,
}

impl Lab {
    /// What one side of `scenario` runs with: a fresh empty directory and a namespace of its
    /// own.
    fn side(
        &self,
        scenario: &Scenario,
        seed: u64,
        side: Side,
        brokers: &Brokers,
    ) -> anyhow::Result<SideRun> {
        let dir = self.dir.join(format!("{}-{}", scenario.name, side.name()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        Ok(SideRun {
            dir,
            seed,
            side,
            brokers: brokers.clone(),
            namespace: format!("lab-{}-{}-{}.", scenario.number, side.name(), &id[..10]),
        })
    }
}

/// Both sides of one scenario.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// The scenario.
    pub scenario: &'static Scenario,
    /// The naive side's ledger.
    pub naive: Ledger,
    /// The pattern's ledger.
    pub pattern: Ledger,
    /// Why it did not run (its server does not answer); both ledgers are then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl Outcome {
    /// What a run must show: the fault bit the naive side, and the pattern kept everything.
    pub fn shows_the_point(&self) -> bool {
        self.naive.failed() && !self.pattern.failed()
    }

    /// Whether it ran and did not show its point.
    pub fn is_broken(&self) -> bool {
        self.skipped.is_none() && !self.shows_the_point()
    }
}

/// Every scenario, in order.
pub fn scenarios() -> &'static [Scenario] {
    static ALL: &[Scenario] = &[
        Scenario {
            number: 1,
            name: "ack-before-processing",
            section: "1. Garantías de entrega",
            naive: "commits the offset, then takes the stock",
            pattern: "takes the stock, then commits the offset",
            explains: "The consumer is killed in the middle of taking the stock. Acknowledged \
                       first, the broker never sends those orders again: their stock is never \
                       taken (at-most-once). Acknowledged after, they come again and are applied.",
            needs: Needs::Embedded,
            run: |r| Box::pin(consumer_crash::run(r, Mistake::AckFirst)),
        },
        Scenario {
            number: 2,
            name: "no-deduplication",
            section: "2. Consumidores idempotentes",
            naive: "takes the stock and acknowledges after, with no processed-message key",
            pattern: "records the id_evento in mensajes_procesados in the effect's transaction",
            explains: "The consumer is killed after its transaction committed and before the \
                       offset did. The order comes again: without a key its stock is taken a \
                       second time; with the key in the same transaction the repeat is seen and \
                       skipped.",
            needs: Needs::Embedded,
            run: |r| Box::pin(consumer_crash::run(r, Mistake::NoKey)),
        },
        Scenario {
            number: 3,
            name: "key-in-another-transaction",
            section: "2. Consumidores idempotentes",
            naive: "records the key in one transaction, takes the stock in another",
            pattern: "the key and the stock in one transaction",
            explains: "The consumer is killed after recording the key and before taking the \
                       stock. The order comes again, the key says it was done, and its stock is \
                       never taken. In one transaction the key rolls back with the effect.",
            needs: Needs::Embedded,
            run: |r| Box::pin(consumer_crash::run(r, Mistake::KeyApart)),
        },
        Scenario {
            number: 4,
            name: "dual-write-crash",
            section: "3. La escritura dual y el patrón Outbox",
            naive: "commits the order, then publishes pedido.creado to the broker",
            pattern: "writes pedido.creado into the outbox in the order's transaction; the relay publishes it",
            explains: "pedidos is killed right after an order's commit. Published as a second \
                       write, that order's event never leaves and nobody hears of the order. In \
                       the outbox the event committed with the order, and the relay publishes it.",
            needs: Needs::Embedded,
            run: |r| Box::pin(dual_write::run(r, Fault::CrashAfterCommit)),
        },
        Scenario {
            number: 5,
            name: "dual-write-rollback",
            section: "3. La escritura dual y el patrón Outbox",
            naive: "publishes pedido.creado inside the order's transaction, before its commit",
            pattern: "writes pedido.creado into the outbox in the order's transaction",
            explains: "An order's transaction fails after its event left (a line breaks its \
                       check) and rolls back. The naive side's event is out already: the others \
                       act on an order that does not exist. The outbox row rolls back with the \
                       order.",
            needs: Needs::Embedded,
            run: |r| Box::pin(dual_write::run(r, Fault::RollbackAfterPublish)),
        },
        Scenario {
            number: 6,
            name: "mark-before-confirm",
            section: "3. La escritura dual y el patrón Outbox",
            naive: "a relay that marks its rows published, then publishes them",
            pattern: "entrega's relay: publishes, waits for the broker's confirmation, then marks",
            explains: "The broker refuses, once, each batch carrying one of three chosen \
                       orders. The naive relay had marked those batches' rows already: nobody \
                       publishes them again, and every order in them is lost. Marking after the \
                       confirmation leaves them pending, and the next round publishes them.",
            needs: Needs::Embedded,
            run: |r| Box::pin(relay_mark::run(r)),
        },
        Scenario {
            number: 7,
            name: "key-per-attempt",
            section: "10. Errores comunes y consejos",
            naive: "pagos retries a charge under a new Idempotency-Key each attempt",
            pattern: "pagos retries under the key it made first (cobro-<pedido>)",
            explains: "The gateway charges three orders and their answers are lost; pagos times \
                       out and tries again. Under a new key the gateway sees a new charge and the \
                       customer pays twice. Under the same key it answers with the charge it \
                       made.",
            needs: Needs::Embedded,
            run: |r| Box::pin(retry_key::run(r)),
        },
        Scenario {
            number: 8,
            name: "poison-in-place",
            section: "6. Mensajes envenenados",
            naive: "retries whatever fails, in place, with a pause that doubles",
            pattern: "entrega's worker: a permanent failure goes to pedidos.eventos.dlq at once, with its reason",
            explains: "Two messages on the partition are malformed JSON: no wait fixes them. \
                       Retried in place, the first one holds the partition for the whole run and \
                       every order behind it is stuck. Classified as permanent, both go to the \
                       dead letters at the first try and the partition goes on.",
            needs: Needs::Embedded,
            run: |r| Box::pin(poison::run(r)),
        },
        Scenario {
            number: 9,
            name: "retry-in-place",
            section: "6. Mensajes envenenados",
            naive: "retries a failing message in place, waiting 200 ms, doubling",
            pattern: "entrega's worker with the retry topic (pedidos.eventos.retry), on the same schedule",
            explains: "Two messages fail for a while (a timeout) and succeed at their fifth \
                       try. Retried in place, the partition waits out their whole schedule and \
                       every healthy order behind them waits too. Through the retry topic the \
                       partition goes on, and the two are applied when their time comes.",
            needs: Needs::Embedded,
            run: |r| Box::pin(retry_place::run(r)),
        },
        Scenario {
            number: 10,
            name: "competing-consumers",
            section: "5. Consumidores competidores y orden por partición",
            naive: "two instances on the seed's one shared queue",
            pattern: "entrega's sharded layout: a key's quorum queue, one active consumer at a time",
            explains: "Two instances of inventario consume each order's creation and then its \
                       cancellation, and a few creations are slow to apply. On one shared \
                       queue RabbitMQ hands the cancellation to the idle instance, which \
                       applies it before the creation. Sharded by key, one order's events wait \
                       for each other and are applied in order.",
            needs: Needs::Rabbitmq,
            run: |r| Box::pin(competing::run(r)),
        },
        Scenario {
            number: 11,
            name: "auto-commit-charge",
            section: "11. Ejercicios (ejercicio 1)",
            naive: "the exercise's consumer: enable.auto.commit, the charge, then the INSERT, no key",
            pattern: "the idempotent consumer: key and payment in one transaction, Idempotency-Key cobro-<pedido>, offset after",
            explains: "pagos is killed right after charging an order. Auto-commit had not sent \
                       the offsets yet, so the restarted consumer reads those orders again and \
                       charges the customer again. The idempotent consumer charges again under \
                       the same key: the gateway answers with the charge it made.",
            needs: Needs::Kafka,
            run: |r| Box::pin(auto_commit::run(r)),
        },
        Scenario {
            number: 12,
            name: "meaning-without-version",
            section: "8. Esquemas de eventos y versionado",
            naive: "a new release sends importe in euros under the same field and version 1",
            pattern: "the new meaning is version 2 with its own field (importe_euros)",
            explains: "Mid-run pedidos starts sending euros where it sent cents. Nothing fails: \
                       analitica reads every event, and every order from the release on is \
                       booked at a hundredth of its price. Versioned, the change is visible to \
                       the consumer, which reads each version by its contract.",
            needs: Needs::Embedded,
            run: |r| Box::pin(meaning::run(r)),
        },
        Scenario {
            number: 13,
            name: "lock-ttl",
            section: "second seed, Comparativa de Enfoques (Redis Distributed Lock)",
            naive: "deduplicates with a Redis lock (SET NX PX) per message and a done key",
            pattern: "the processed-message key in the effect's transaction",
            explains: "Worker A pauses, holding an order's lock, longer than the lock's TTL, \
                       and the order is delivered again to worker B. The lock has expired: B \
                       takes it and applies the order, and so does A when it wakes. In the \
                       effect's transaction B waits for A's commit and finds the key.",
            needs: Needs::Redis,
            run: |r| Box::pin(lock::run(r, lock::Fix::KeyInTransaction)),
        },
        Scenario {
            number: 14,
            name: "lock-fencing",
            section: "second seed, Comparativa de Enfoques (Redis Distributed Lock)",
            naive: "deduplicates with a Redis lock (SET NX PX) per message and a done key",
            pattern: "the same lock with a fencing token (INCR) that the database checks",
            explains: "The same pause past the lock's TTL. Keeping the lock, each holder takes \
                       a token that grows, and the database refuses a write with an older \
                       token than one it has seen: A, waking after B wrote, is refused.",
            needs: Needs::Redis,
            run: |r| Box::pin(lock::run(r, lock::Fix::FencingToken)),
        },
        Scenario {
            number: 15,
            name: "pipeline-without-transactions",
            section: "1. Garantías de entrega (Kafka → Kafka)",
            naive: "a Kafka → Kafka step writes a batch's sales, then commits the batch's offsets",
            pattern: "analitica's KafkaTransformer: the sales and the offsets in one Kafka transaction",
            explains: "The step is killed after writing a batch's sales and before committing \
                       its offsets. Without a transaction the next instance reads the batch \
                       again and every sale in it is counted twice. In a transaction the dead \
                       batch's sales are aborted, hidden from read_committed readers, and \
                       written once when the batch is read again.",
            needs: Needs::Kafka,
            run: |r| Box::pin(pipeline::run(r)),
        },
        Scenario {
            number: 16,
            name: "broker-down",
            section: "3. La escritura dual y el patrón Outbox",
            naive: "pedidos stores the order, then publishes pedido.creado from the request path",
            pattern: "pedidos writes pedido.creado into the outbox; the relay publishes it",
            explains: "The broker is down while a dozen orders come in. Publishing from the \
                       request path, those customers get errors for orders that were stored and \
                       that nobody downstream ever hears of. With the outbox every order is \
                       accepted, and the relay drains them when the broker is back.",
            needs: Needs::Embedded,
            run: |r| Box::pin(outage::run(r)),
        },
        Scenario {
            number: 17,
            name: "compensation-twice",
            section: "second seed, Patrón Saga y Compensaciones",
            naive: "inventario releases a cancelled order's stock once per message (id_evento)",
            pattern: "once per deterministic key (liberacion-<pedido>), whatever the message",
            explains: "The saga's timer sends three releases again while the first are on their \
                       way; each resend is a new message with the same key. Deduplicated by \
                       message, the stock comes back twice. Deduplicated by the compensation's \
                       key, it comes back once.",
            needs: Needs::Embedded,
            run: |r| Box::pin(compensation::run(r)),
        },
    ];
    ALL
}

/// The scenario named `name` (or numbered), or every one for `all`.
pub fn find(name: &str) -> anyhow::Result<Vec<&'static Scenario>> {
    if name == "all" {
        return Ok(scenarios().iter().collect());
    }
    let found = scenarios()
        .iter()
        .find(|s| s.name == name || s.number.to_string() == name);
    match found {
        Some(s) => Ok(vec![s]),
        None => bail!(
            "no scenario {name:?}; `km0 lab list` names them ({})",
            scenarios()
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Runs both sides of each of `scenarios` with `seed`, in a directory of its own; a scenario
/// whose server does not answer is skipped, with the reason.
pub async fn run(
    scenarios: &[&'static Scenario],
    seed: u64,
    brokers: &Brokers,
) -> anyhow::Result<Vec<Outcome>> {
    let dir = std::env::temp_dir().join(format!(
        "km0-lab-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let lab = Lab { dir };
    let mut outcomes = Vec::with_capacity(scenarios.len());
    let result = async {
        for scenario in scenarios {
            if let Some(reason) = brokers.unreachable(scenario.needs).await {
                outcomes.push(Outcome {
                    scenario,
                    naive: Ledger::default(),
                    pattern: Ledger::default(),
                    skipped: Some(reason),
                });
                continue;
            }
            let naive = lab.side(scenario, seed, Side::Naive, brokers)?;
            let naive = (scenario.run)(&naive).await?;
            let pattern = lab.side(scenario, seed, Side::Pattern, brokers)?;
            let pattern = (scenario.run)(&pattern).await?;
            outcomes.push(Outcome {
                scenario,
                naive,
                pattern,
                skipped: None,
            });
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&lab.dir);
    result.map(|()| outcomes)
}

/// `km0 lab ...`: lists the scenarios or runs them and prints their ledgers.
pub async fn command(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::AutoCommitConsumer(args) => auto_commit::consumer(args).await?,
        LabCommand::List { json } => {
            let all = scenarios();
            let text = if json {
                serde_json::to_string_pretty(all)?
            } else {
                render::list(all)
            };
            crate::ops::terminal::println(&text);
        }
        LabCommand::Run {
            scenario,
            seed,
            json,
            brokers,
        } => {
            let outcomes = run(&find(&scenario)?, seed, &brokers).await?;
            let text = if json {
                serde_json::to_string_pretty(&render::to_json(&outcomes, seed))?
            } else {
                render::ledgers(&outcomes)
            };
            crate::ops::terminal::println(&text);
            if let Some(broken) = outcomes.iter().find(|o| o.is_broken()) {
                bail!(
                    "scenario {} did not show its point: the naive side must fail and the \
                     pattern must not",
                    broken.scenario.name
                );
            }
        }
    }
    Ok(())
}
