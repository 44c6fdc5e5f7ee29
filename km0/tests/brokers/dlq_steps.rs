//! The deployment `km0 dlq` is tested on, and the truth read around it: broker positions,
//! operator tables and inventario's rows, read without going through km0's dlq code.

use std::net::SocketAddr;
use std::time::Duration;

use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Envelope, Headers, OutgoingMessage, Record};
use km0::services::inventario::{CONSUMER, GROUP};
use km0::services::pedidos::TOPIC;
use km0::wiring::config::{DataPlace, Databases};
use km0::wiring::{dead_letter_topic, ensure_topics, Broker, Components, Running, System};
use serde_json::{json, Value};
use sqlx::SqlitePool;
use uuid::Uuid;

use crate::common::state::eventually;

/// The operators' replay key of the deployment: its consumers and its `km0` commands share it.
pub const REPLAY_KEY: &str = "dlq-cli-tests-replay-key";

/// What must not change when a request is refused or dry-run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Records ever written to `pedidos.eventos`.
    pub origin_end: i64,
    /// Records ever written to `pedidos.eventos.dlq`.
    pub dead_letters: i64,
    /// `entrega_dlq_state` rows: id, state, replays.
    pub state_rows: Vec<(String, String, i64)>,
    /// `entrega_dlq_audit` rows.
    pub audit_rows: i64,
    /// Stock per product.
    pub stock: Vec<(String, i64)>,
    /// Processed-message keys of the stock consumer.
    pub keys: i64,
}

/// One row of `entrega_dlq_audit`, in id order.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub at_ms: i64,
    pub operator: String,
    pub action: String,
    pub dry_run: bool,
    pub matched: i64,
    pub applied: i64,
    pub refused: i64,
    pub detail: Option<String>,
}

/// A deployment with the inventario consumer running in this process.
pub struct Deployment {
    dir: std::path::PathBuf,
    broker_url: String,
    broker: Broker,
    running: Running,
    inventario: SqlitePool,
    patience: Duration,
}

impl Deployment {
    pub async fn start(broker_url: &str, patience: Duration) -> Self {
        let dir = std::env::temp_dir().join(format!("km0-dlq-{}", Uuid::new_v4().simple()));
        let system = System::new(
            Databases::new(DataPlace::SqliteDir(dir.clone())),
            broker_url.to_owned(),
        )
        .with_lease_ttl(Duration::from_secs(3))
        .with_replay_key(entrega_core::ReplayKey::new(REPLAY_KEY).unwrap());
        let broker = system.broker().await.unwrap();
        ensure_topics(&broker).await.unwrap();
        let stock = system.inventario().await.unwrap();
        stock.db().close().await;
        let mut components = Components::none("dlq-test");
        components.add(&km0::services::inventario::COMPONENT);
        let http: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let running = system.start(components, http).await.unwrap();
        let url = format!("sqlite://{}", dir.join("inventario.db").display());
        let inventario = SqlitePool::connect(&url).await.unwrap();
        Self {
            dir,
            broker_url: broker_url.to_owned(),
            broker,
            running,
            inventario,
            patience,
        }
    }

    /// Publishes a `tipo` event of an order of `units` of `product`; returns its `id_evento`.
    pub async fn order(&self, key: &str, tipo: &str, product: &str, units: i64) -> Uuid {
        let datos = json!({"id": key, "cliente": "ana", "mercado": "girona",
            "lineas": [{"producto": product, "cantidad": units, "precio_centimos": 150}]});
        let envelope = Envelope::new(tipo, "pedidos", datos);
        let message = OutgoingMessage {
            topic: TOPIC.to_owned(),
            key: Some(key.to_owned()),
            headers: Headers::new()
                .with(TIPO, tipo)
                .with(ID_EVENTO, envelope.id.to_string()),
            payload: envelope.to_bytes(),
        };
        self.broker.publisher().publish(&[message]).await.unwrap();
        envelope.id
    }

    async fn total(&self, topic: &str) -> i64 {
        let ends = self.broker.end_offsets(topic).await.unwrap();
        ends.iter().map(|(_, e)| *e).sum()
    }

    pub async fn wait_dead_letters(&self, n: i64) {
        eventually(self.patience, &format!("{n} dead letters"), || async {
            // A broker still settling answers some requests with a transient error
            // (NotCoordinator): asked again on the next round.
            let ends = self.broker.end_offsets(&dead_letter_topic()).await.ok()?;
            (ends.iter().map(|(_, e)| *e).sum::<i64>() == n).then_some(())
        })
        .await;
    }

    /// Waits until the stock consumer has committed every record of the orders topic.
    pub async fn wait_caught_up(&self) {
        eventually(self.patience, "inventario caught up", || async {
            // A group coordinator still moving answers NotCoordinator: asked again.
            let ends = self.broker.end_offsets(TOPIC).await.ok()?;
            let committed = self.broker.committed(GROUP, TOPIC).await.ok()?;
            let done = ends
                .iter()
                .all(|(p, end)| *end == 0 || committed.iter().any(|(q, c)| q == p && c == end));
            done.then_some(())
        })
        .await;
    }

    /// Runs `km0 --database .. --broker .. <args>` with the deployment's replay key: exit
    /// code, stdout, stderr.
    pub async fn km0(&self, args: &[&str]) -> (i32, String, String) {
        self.km0_keyed(args, REPLAY_KEY).await
    }

    /// [`Deployment::km0`] with `replay_key` as `KM0_REPLAY_KEY` (empty: none).
    pub async fn km0_keyed(&self, args: &[&str], replay_key: &str) -> (i32, String, String) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_km0"))
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            .env("KM0_REPLAY_KEY", replay_key)
            .arg("--database")
            .arg(format!("sqlite://{}", self.dir.display()))
            .args(["--broker", &self.broker_url])
            .args(args)
            .env_remove("KM0_DATABASE")
            .env_remove("KM0_BROKER")
            .env("RUST_LOG", "warn")
            .output()
            .await
            .expect("run km0");
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (
            out.status.code().unwrap_or(-1),
            text(out.stdout),
            text(out.stderr),
        )
    }

    /// Runs a command that must succeed and print JSON.
    pub async fn json(&self, args: &[&str]) -> Value {
        let (code, stdout, stderr) = self.km0(args).await;
        assert_eq!(code, 0, "km0 {args:?} failed: {stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
    }

    /// The row of a `list --json` output for the event `id`.
    pub fn row_of(&self, listed: &Value, id: &Uuid) -> Value {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["event_id"] == id.to_string())
            .cloned()
            .unwrap_or_else(|| panic!("no row for {id} in {listed:#}"))
    }

    /// The broker's record at the place a listed row names.
    pub async fn dead_letter_record(&self, row: &Value) -> Record {
        let (topic, partition, offset) = (
            row["topic"].as_str().unwrap(),
            u32::try_from(row["partition"].as_u64().unwrap()).unwrap(),
            row["offset"].as_i64().unwrap(),
        );
        let records = self.broker.read(topic, partition, offset, 1).await.unwrap();
        records.into_iter().find(|r| r.offset == offset).unwrap()
    }

    pub async fn snapshot(&self) -> Snapshot {
        let db = &self.inventario;
        Snapshot {
            origin_end: self.total(TOPIC).await,
            dead_letters: self.total(&dead_letter_topic()).await,
            state_rows: sqlx::query_as(
                "SELECT dlq_topic || '/' || partition_no || '/' || log_offset, state, replays
                 FROM entrega_dlq_state ORDER BY 1",
            )
            .fetch_all(db)
            .await
            .unwrap(),
            audit_rows: sqlx::query_scalar("SELECT COUNT(*) FROM entrega_dlq_audit")
                .fetch_one(db)
                .await
                .unwrap(),
            stock: sqlx::query_as("SELECT producto, unidades FROM stock ORDER BY producto")
                .fetch_all(db)
                .await
                .unwrap(),
            keys: sqlx::query_scalar("SELECT COUNT(*) FROM mensajes_procesados")
                .fetch_one(db)
                .await
                .unwrap(),
        }
    }

    /// Fixes the cause of "producto desconocido": the product now exists.
    pub async fn add_product(&self, product: &str, units: i64) {
        sqlx::query("INSERT INTO stock (producto, unidades) VALUES (?, ?)")
            .bind(product)
            .bind(units)
            .execute(&self.inventario)
            .await
            .unwrap();
    }

    pub async fn stock(&self, product: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT unidades FROM stock WHERE producto = ?")
            .bind(product)
            .fetch_optional(&self.inventario)
            .await
            .unwrap()
    }

    /// Processed-message rows of the event `id` for the stock consumer.
    pub async fn keys_of(&self, id: &Uuid) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM mensajes_procesados WHERE id_mensaje = ? AND consumidor = ?",
        )
        .bind(id.hyphenated().to_string())
        .bind(CONSUMER)
        .fetch_one(&self.inventario)
        .await
        .unwrap()
    }

    pub async fn audit_rows(&self) -> Vec<AuditRow> {
        type Columns = (i64, String, String, bool, i64, i64, i64, Option<String>);
        let rows: Vec<Columns> = sqlx::query_as(
            "SELECT at_ms, operator, action, dry_run, matched, applied, refused, detail
             FROM entrega_dlq_audit ORDER BY id",
        )
        .fetch_all(&self.inventario)
        .await
        .unwrap();
        rows.into_iter()
            .map(|r| AuditRow {
                at_ms: r.0,
                operator: r.1,
                action: r.2,
                dry_run: r.3,
                matched: r.4,
                applied: r.5,
                refused: r.6,
                detail: r.7,
            })
            .collect()
    }

    pub async fn finish(self) {
        self.running.stop().await.unwrap();
        self.inventario.close().await;
        self.broker.close().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
