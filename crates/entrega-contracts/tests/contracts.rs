//! Typed events, their schemas, upcasting, validation and the committed contracts directory,
//! through the crate's public API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use entrega_contracts::{
    schema_of, Catalog, Compatibility, ContractError, Directory, Event, Finding, Upcasters,
};
use entrega_core::{DeadClass, Envelope, HandlerError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `pedido.creado` as the seed's first services wrote it.
mod v1 {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct Linea {
        pub producto: String,
        pub cantidad: u32,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct PedidoCreado {
        pub id: String,
        pub cliente: String,
        pub lineas: Vec<Linea>,
    }

    impl Event for PedidoCreado {
        const TIPO: &'static str = "pedido.creado";
        const VERSION: u32 = 1;
    }
}

/// Version 1 with an optional field added: a compatible change.
mod v1_with_notes {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct PedidoCreado {
        pub id: String,
        pub cliente: String,
        pub lineas: Vec<v1::Linea>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub notas: Option<String>,
    }

    impl Event for PedidoCreado {
        const TIPO: &'static str = "pedido.creado";
        const VERSION: u32 = 1;
    }
}

/// Version 1 with `cliente` renamed under the same version: incompatible.
mod v1_renamed {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct PedidoCreado {
        pub id: String,
        pub cliente_id: String,
        pub lineas: Vec<v1::Linea>,
    }

    impl Event for PedidoCreado {
        const TIPO: &'static str = "pedido.creado";
        const VERSION: u32 = 1;
    }
}

/// The seed's version 2: prices on the lines, a delivery address.
mod v2 {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct Linea {
        pub producto: String,
        pub cantidad: u32,
        pub precio_centimos: i64,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct Direccion {
        pub ciudad: String,
        pub codigo_postal: String,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct PedidoCreado {
        pub id: String,
        pub cliente: String,
        pub lineas: Vec<Linea>,
        pub direccion_entrega: Direccion,
    }

    impl Event for PedidoCreado {
        const TIPO: &'static str = "pedido.creado";
        const VERSION: u32 = 2;
    }
}

fn envelope(tipo: &str, version: u32, datos: Value) -> Envelope {
    let mut envelope = Envelope::new(tipo, "pedidos", datos);
    envelope.version = version;
    envelope
}

fn v1_datos() -> Value {
    json!({"id": "P-1", "cliente": "ana", "lineas": [{"producto": "queso", "cantidad": 2}],
           "campo_futuro": true})
}

/// v1 → v2: a price nobody knew is 0, the address unknown ("desconocida").
fn upcasters() -> Upcasters {
    Upcasters::new().step("pedido.creado", 1, |mut datos| {
        let lineas = datos
            .get_mut("lineas")
            .and_then(Value::as_array_mut)
            .ok_or("no `lineas`")?;
        for linea in lineas {
            linea["precio_centimos"] = json!(0);
        }
        datos["direccion_entrega"] = json!({"ciudad": "desconocida", "codigo_postal": ""});
        Ok(datos)
    })
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "entrega-contracts-{name}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_schema_is_closed_titled_and_lists_required_members() {
    let schema = schema_of::<v2::PedidoCreado>();
    assert_eq!(schema["title"], "pedido.creado v2");
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["$defs"]["Linea"]["additionalProperties"], false);
    assert_eq!(schema["$defs"]["Direccion"]["additionalProperties"], false);
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(required.contains(&"direccion_entrega"), "{required:?}");
    // An optional member is not required.
    let with_notes = schema_of::<v1_with_notes::PedidoCreado>();
    assert!(!with_notes["required"]
        .as_array()
        .unwrap()
        .contains(&json!("notas")));
}

#[test]
fn an_event_reads_its_own_version_ignoring_unknown_members() {
    let read: v1::PedidoCreado = Upcasters::new()
        .decode(&envelope("pedido.creado", 1, v1_datos()))
        .unwrap();
    assert_eq!(read.cliente, "ana");
    assert_eq!(read.lineas[0].cantidad, 2);
}

#[test]
fn an_older_version_is_upcast_and_a_newer_or_pathless_one_is_refused() {
    let read: v2::PedidoCreado = upcasters()
        .decode(&envelope("pedido.creado", 1, v1_datos()))
        .unwrap();
    assert_eq!(read.lineas[0].precio_centimos, 0);
    assert_eq!(read.direccion_entrega.ciudad, "desconocida");
    assert_eq!(upcasters().readable("pedido.creado", 2), [2, 1]);

    let no_path = Upcasters::new()
        .decode::<v2::PedidoCreado>(&envelope("pedido.creado", 1, v1_datos()))
        .unwrap_err();
    assert!(
        matches!(
            no_path,
            ContractError::NoPath {
                version: 1,
                understood: 2,
                missing: 1,
                ..
            }
        ),
        "{no_path:?}"
    );
    assert!(no_path
        .to_string()
        .contains("no upcaster from version 1 to 2"));

    let newer = upcasters()
        .decode::<v1::PedidoCreado>(&envelope("pedido.creado", 2, json!({})))
        .unwrap_err();
    assert!(matches!(
        newer,
        ContractError::Newer {
            version: 2,
            understood: 1,
            ..
        }
    ));

    let other = upcasters()
        .decode::<v1::PedidoCreado>(&envelope("pedido.pagado", 1, json!({})))
        .unwrap_err();
    assert!(matches!(other, ContractError::WrongType { .. }));
}

#[test]
fn datos_that_do_not_fit_name_the_member_and_become_esquema_dead_letters() {
    let bad = json!({"id": "P-1", "cliente": "ana", "lineas": [{"producto": "queso", "cantidad": "dos"}]});
    let error = Upcasters::new()
        .decode::<v1::PedidoCreado>(&envelope("pedido.creado", 1, bad))
        .unwrap_err();
    assert_eq!(error.field(), Some("lineas[0].cantidad"));
    assert!(
        error.to_string().contains("pedido.creado` version 1"),
        "{error}"
    );
    let handler: HandlerError = error.into();
    assert!(!handler.is_transient());
    assert_eq!(handler.dead_class(), DeadClass::Schema);
    assert_eq!(handler.code(), Some("invalid_data"));
    assert_eq!(DeadClass::Schema.as_str(), "esquema");

    let refused = Upcasters::new()
        .step("pedido.creado", 1, |_| Err("no lines to price".to_owned()))
        .decode::<v2::PedidoCreado>(&envelope("pedido.creado", 1, v1_datos()))
        .unwrap_err();
    assert!(matches!(refused, ContractError::Upcast { from: 1, .. }));
}

#[test]
fn a_catalog_validates_what_producers_write() {
    let catalog =
        Catalog::new().event::<v2::PedidoCreado>("pedidos.eventos", "An order was placed.");
    let good = v2::PedidoCreado {
        id: "P-1".into(),
        cliente: "ana".into(),
        lineas: vec![v2::Linea {
            producto: "queso".into(),
            cantidad: 1,
            precio_centimos: 1450,
        }],
        direccion_entrega: v2::Direccion {
            ciudad: "Girona".into(),
            codigo_postal: "17001".into(),
        },
    };
    let datos = good.datos().unwrap();
    catalog.validate("pedido.creado", 2, &datos).unwrap();

    let mut extra = datos.clone();
    extra["lineas"][0]["descuento"] = json!(5);
    let error = catalog.validate("pedido.creado", 2, &extra).unwrap_err();
    assert_eq!(error.field(), Some("lineas[0].descuento"));

    let mut missing = datos.clone();
    missing["direccion_entrega"]
        .as_object_mut()
        .unwrap()
        .remove("ciudad");
    let error = catalog.validate("pedido.creado", 2, &missing).unwrap_err();
    assert_eq!(error.field(), Some("direccion_entrega.ciudad"));

    let mut wrong = datos.clone();
    wrong["lineas"][0]["cantidad"] = json!(-1);
    let error = catalog.validate("pedido.creado", 2, &wrong).unwrap_err();
    assert_eq!(error.field(), Some("lineas[0].cantidad"));

    assert!(matches!(
        catalog.validate("pedido.creado", 7, &datos),
        Err(ContractError::Unregistered { version: 7, .. })
    ));
    // A tipo the catalog does not speak for passes.
    catalog
        .validate("otro.evento", 1, &json!({"x": 1}))
        .unwrap();

    let event = good.outgoing("pedido", "P-1").unwrap();
    assert_eq!((event.kind.as_str(), event.version), ("pedido.creado", 2));
    assert_eq!(event.payload, datos);
}

#[test]
fn the_directory_records_new_and_compatible_changes_and_refuses_incompatible_ones() {
    let root = temp_dir("directory");
    let dir = Directory::new(&root);
    let channel = "pedidos.eventos";

    let first = Catalog::new().event::<v1::PedidoCreado>(channel, "An order was placed.");
    assert_eq!(
        dir.check(&first).unwrap(),
        [Finding::New {
            tipo: "pedido.creado".into(),
            version: 1
        }]
    );
    assert!(dir.update(&first).unwrap().is_ok());
    assert!(dir.check(&first).unwrap().is_empty());

    // An optional member added: compatible, recorded as revision 2.
    let notes =
        Catalog::new().event::<v1_with_notes::PedidoCreado>(channel, "An order was placed.");
    assert_eq!(
        dir.check(&notes).unwrap(),
        [Finding::Changed {
            tipo: "pedido.creado".into(),
            version: 1
        }]
    );
    dir.update(&notes).unwrap().unwrap();
    let file: entrega_contracts::ContractFile =
        serde_json::from_str(&std::fs::read_to_string(dir.path("pedido.creado", 1)).unwrap())
            .unwrap();
    assert_eq!(file.revisions.len(), 2);
    assert_eq!(file.compatibility, "BACKWARD_TRANSITIVE");

    // A member renamed under the same version: refused, nothing written.
    let renamed = Catalog::new().event::<v1_renamed::PedidoCreado>(channel, "An order was placed.");
    let findings = dir.check(&renamed).unwrap();
    assert_eq!(findings.len(), 1);
    let message = findings[0].to_string();
    assert!(
        message.contains("`pedido.creado` v1 breaks BACKWARD_TRANSITIVE"),
        "{message}"
    );
    assert!(message.contains("`cliente_id`"), "{message}");
    assert!(message.contains("version 2"), "{message}");
    let before = std::fs::read_to_string(dir.path("pedido.creado", 1)).unwrap();
    assert!(dir.update(&renamed).unwrap().is_err());
    assert_eq!(
        std::fs::read_to_string(dir.path("pedido.creado", 1)).unwrap(),
        before
    );

    // Under NONE the same change is accepted.
    let lax = renamed.clone().policy(channel, Compatibility::None);
    assert_eq!(
        dir.check(&lax).unwrap(),
        [Finding::Changed {
            tipo: "pedido.creado".into(),
            version: 1
        }]
    );

    // The change made as version 2 beside version 1: a new contract, nothing broken.
    let bumped = notes
        .clone()
        .event::<v2::PedidoCreado>(channel, "An order was placed.");
    assert_eq!(
        dir.check(&bumped).unwrap(),
        [Finding::New {
            tipo: "pedido.creado".into(),
            version: 2
        }]
    );

    // Dropping version 1 from the code is reported until its file is deleted.
    let only_v2 = Catalog::new().event::<v2::PedidoCreado>(channel, "An order was placed.");
    dir.update(&bumped).unwrap().unwrap();
    assert_eq!(
        dir.check(&only_v2).unwrap(),
        [Finding::Gone {
            tipo: "pedido.creado".into(),
            version: 1
        }]
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_hand_edited_history_that_breaks_its_policy_is_found() {
    let root = temp_dir("history");
    let dir = Directory::new(&root);
    let channel = "pedidos.eventos";
    let catalog = Catalog::new().event::<v1::PedidoCreado>(channel, "An order was placed.");
    dir.update(&catalog).unwrap().unwrap();
    let path = dir.path("pedido.creado", 1);
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let renamed = schema_of::<v1_renamed::PedidoCreado>();
    let current = schema_of::<v1::PedidoCreado>();
    file["revisions"] = json!([renamed, current]);
    std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
    let findings = dir.check(&catalog).unwrap();
    assert!(
        matches!(&findings[..], [Finding::BrokenHistory { revision: 2, .. }]),
        "{findings:?}"
    );
    std::fs::write(&path, "{not json").unwrap();
    let findings = dir.check(&catalog).unwrap();
    assert!(
        matches!(&findings[..], [Finding::Unreadable { .. }]),
        "{findings:?}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_reworded_schema_replaces_its_last_revision() {
    let root = temp_dir("reworded");
    let dir = Directory::new(&root);
    let catalog = Catalog::new().event::<v1::PedidoCreado>("pedidos.eventos", "An order.");
    dir.update(&catalog).unwrap().unwrap();
    // The same schema with other words: a description changed, a member named `title` kept.
    let mut schema = schema_of::<v1::PedidoCreado>();
    schema["description"] = json!("An order, as its client sent it.");
    schema["properties"]["cliente"]["description"] = json!("Who ordered.");
    let reworded =
        Catalog::new().schema("pedido.creado", 1, "pedidos.eventos", "An order.", schema);
    assert_eq!(
        dir.check(&reworded).unwrap(),
        [Finding::Reworded {
            tipo: "pedido.creado".into(),
            version: 1
        }]
    );
    dir.update(&reworded).unwrap().unwrap();
    let file: entrega_contracts::ContractFile =
        serde_json::from_str(&std::fs::read_to_string(dir.path("pedido.creado", 1)).unwrap())
            .unwrap();
    assert_eq!(file.revisions.len(), 1);
    assert!(dir.check(&reworded).unwrap().is_empty());
    std::fs::remove_dir_all(&root).unwrap();
}
