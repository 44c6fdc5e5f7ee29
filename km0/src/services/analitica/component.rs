//! analitica as one component (`km0 run analitica`), as group member and transactional id
//! `<instance>-analitica`: sales per market from `pedidos.eventos` to `analitica.ventas`, in
//! the broker's transactions. Refused by a broker without them.

use anyhow::Context as _;
use async_trait::async_trait;
use entrega_kafka::{KafkaTransformer, TransformerConfig};

use super::{SalesTransform, GROUP, OUTPUT_PARTITIONS, OUTPUT_TOPIC};
use crate::services::pedidos::TOPIC;
use crate::wiring::{ensure_topics, Component, Database, InUp, Start, Started};

/// analitica: see the module.
pub const COMPONENT: Analitica = Analitica;

/// See [`COMPONENT`].
#[derive(Debug, Clone, Copy)]
pub struct Analitica;

#[async_trait]
impl Component for Analitica {
    fn name(&self) -> &'static str {
        "analitica"
    }

    fn about(&self) -> &'static str {
        "Sales per market in the broker's transactions (Kafka brokers only)"
    }

    fn database(&self) -> Option<&'static Database> {
        None
    }

    fn in_up(&self) -> InUp {
        InUp::WithTransactions
    }

    async fn start(&self, start: Start<'_>) -> anyhow::Result<Started> {
        let system = start.system;
        let instance = start.components.instance.as_str();
        let broker = system.broker().await.context("opening the broker")?;
        let Some(kafka) = broker.transactions() else {
            anyhow::bail!(
                "analitica writes its sales in Kafka transactions: it needs --broker kafka://..., \
                 not the {}",
                broker.kind()
            );
        };
        ensure_topics(&broker).await?;
        broker
            .admin()
            .ensure_topic(OUTPUT_TOPIC, OUTPUT_PARTITIONS)
            .await
            .with_context(|| format!("creating topic {OUTPUT_TOPIC}"))?;
        let name = format!("{instance}-analitica");
        let config = TransformerConfig::new(GROUP, name.clone(), name, &[TOPIC]);
        let transformer = KafkaTransformer::start(kafka.config(), config)
            .await
            .context("starting analitica's transactional clients")?;
        tracing::info!(instance, "analitica started");
        let replay_key = system.replay_key().cloned();
        let stop = start.stop.clone();
        let task = tokio::spawn(async move {
            let transform = SalesTransform::new(TOPIC).with_replay_key(replay_key);
            transformer
                .run(&transform, stop.cancelled_owned())
                .await
                .map(drop)
                .context("analitica")
        });
        Ok(Started {
            tasks: vec![("analitica", task)],
            ..Started::default()
        })
    }
}
