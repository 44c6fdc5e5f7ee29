//! km0's contracts in a real schema registry with the Confluent API (Apicurio Registry, which
//! `scripts/test` starts: `ENTREGA_TEST_SCHEMA_REGISTRY`): `km0 contracts register` puts each
//! contract under its subject with its channel's level, idempotently; `km0 migrate` does it
//! when `KM0_SCHEMA_REGISTRY` is set; the registry refuses a schema that breaks the level, and
//! says so when asked, as entrega's own check does. Subjects carry a prefix of the test's own.

use std::process::Output;

use entrega::contracts::compat;
use entrega::{Catalog, Compatibility, Event};
use km0::contracts::orders::{Line, OrderCreated};
use km0::contracts::registry::{RegistryError, SchemaRegistry};
use km0::services::pedidos::TOPIC;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn registry_url() -> String {
    std::env::var("ENTREGA_TEST_SCHEMA_REGISTRY").expect(
        "ENTREGA_TEST_SCHEMA_REGISTRY: the Confluent API of a schema registry \
         (scripts/test starts Apicurio Registry and sets it)",
    )
}

async fn km0(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_km0"));
    command
        .args(args)
        .env_remove("KM0_SCHEMA_REGISTRY")
        .env_remove("KM0_SCHEMA_REGISTRY_PREFIX")
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().await.expect("run km0")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "km0 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// `pedido.creado` version 2 with `cliente` gone: a closed reader without it cannot read what
/// was written with it.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct WithoutCustomer {
    id: String,
    lineas: Vec<Line>,
}

impl Event for WithoutCustomer {
    const TIPO: &'static str = "pedido.creado";
    const VERSION: u32 = 2;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contracts_are_registered_once_and_a_breaking_change_is_refused() {
    let url = registry_url();
    let prefix = format!("t-{}-", uuid::Uuid::new_v4().simple());
    let catalog = km0::contracts::catalog();
    let contracts = catalog.contracts().count();

    // Registered: one subject per contract, each new, each at its channel's level.
    let first: Value = serde_json::from_str(&stdout(
        &km0(
            &[
                "contracts",
                "register",
                "--registry",
                &url,
                "--subject-prefix",
                &prefix,
                "--json",
            ],
            &[],
        )
        .await,
    ))
    .unwrap();
    let first = first.as_array().unwrap();
    assert_eq!(first.len(), contracts);
    assert!(first.iter().all(|r| r["new"] == true), "{first:?}");
    assert!(first
        .iter()
        .all(|r| r["level"] == Compatibility::BackwardTransitive.to_string()));
    let registry = SchemaRegistry::new(&url)
        .unwrap()
        .with_prefix(prefix.clone());
    let subjects: Vec<String> = registry
        .subjects()
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.starts_with(&prefix))
        .collect();
    assert_eq!(subjects.len(), contracts);
    let created = registry.subject(OrderCreated::TIPO, OrderCreated::VERSION);
    assert_eq!(registry.versions(&created).await.unwrap(), [1]);

    // `km0 migrate` with a registry registers again: nothing new, the same ids.
    let dir = std::env::temp_dir().join(format!("km0-registry-{}", uuid::Uuid::new_v4().simple()));
    let database = format!("sqlite://{}", dir.display());
    let migrated = stdout(
        &km0(
            &["--database", &database, "migrate"],
            &[
                ("KM0_SCHEMA_REGISTRY", url.as_str()),
                ("KM0_SCHEMA_REGISTRY_PREFIX", prefix.as_str()),
            ],
        )
        .await,
    );
    assert!(
        migrated.contains(&format!("schema registry: {contracts} contracts, 0 new")),
        "{migrated}"
    );
    let again = registry.register(&catalog).await.unwrap();
    let ids = |rs: &[km0::contracts::registry::Registered]| -> Vec<(String, i64)> {
        rs.iter().map(|r| (r.subject.clone(), r.id)).collect()
    };
    let first_ids: Vec<(String, i64)> = first
        .iter()
        .map(|r| {
            (
                r["subject"].as_str().unwrap().to_owned(),
                r["id"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ids(&again), first_ids);
    assert!(again.iter().all(|r| !r.new));
    assert_eq!(registry.versions(&created).await.unwrap(), [1]);
    stdout(
        &km0(
            &[
                "contracts",
                "check",
                "--dir",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../contracts"),
                "--registry",
                &url,
                "--subject-prefix",
                &prefix,
            ],
            &[],
        )
        .await,
    );

    // A breaking change: the registry says so when asked, refuses it when registered, and
    // entrega's own check agrees, naming the member.
    let broken = Catalog::new().event::<WithoutCustomer>(TOPIC, "cliente removed");
    let candidate = &broken.contracts().next().unwrap().schema;
    assert!(!registry
        .compatible(WithoutCustomer::TIPO, WithoutCustomer::VERSION, candidate)
        .await
        .unwrap());
    match registry.register(&broken).await {
        Err(RegistryError::Incompatible { subject, .. }) => assert_eq!(subject, created),
        other => panic!("expected the registry to refuse it, got {other:?}"),
    }
    assert_eq!(registry.versions(&created).await.unwrap(), [1]);
    let history = [catalog
        .contracts()
        .find(|c| c.tipo == OrderCreated::TIPO && c.version == OrderCreated::VERSION)
        .unwrap()
        .schema
        .clone()];
    let violations = compat::check(Compatibility::BackwardTransitive, &history, candidate).unwrap();
    assert!(
        violations.iter().any(|v| v.to_string().contains("cliente")),
        "{violations:?}"
    );
    // A compatible schema of the same subject would be accepted.
    assert!(registry
        .compatible(OrderCreated::TIPO, OrderCreated::VERSION, &history[0])
        .await
        .unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
