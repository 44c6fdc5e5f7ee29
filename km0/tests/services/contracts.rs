//! km0's contracts: the committed files under `contracts/` match the code (the CI check of
//! ADR 0019), and what each service writes today meets the contract of its `tipo`.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::PathBuf;

use entrega::contracts::Directory;
use entrega::NewEvent;
use km0::contracts::{self, orders, payments, stock};
use km0::services::inventario::{
    reservation_answer, stock_updated, Motive, ReleaseCommand, ReserveCommand, StockLine,
};
use km0::services::pagos::{
    charge_command, refund_command, Authorisation, OrderToCharge, RefundRequest,
};
use km0::services::pedidos::{order_created, order_created_in_saga, NewOrder};
use km0::services::reparto::{assigned_event, refused_event, AssignCommand};
use serde_json::json;

fn committed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(contracts::DIRECTORY)
}

#[test]
fn the_committed_contracts_match_the_code() {
    let findings = Directory::new(committed())
        .check(&contracts::catalog())
        .expect("reading contracts/");
    let listed: Vec<String> = findings.iter().map(ToString::to_string).collect();
    assert!(
        findings.is_empty(),
        "contracts/ and the code differ (`km0 contracts update` records compatible changes):\n{}",
        listed.join("\n")
    );
}

/// Each `NewEvent` validates against the catalog and reads back as its type unchanged.
fn meets<E: entrega::Event + PartialEq + std::fmt::Debug>(
    event: &Result<NewEvent, entrega::ContractError>,
) -> E {
    let event = event.as_ref().expect("the service's event serializes");
    let catalog = contracts::catalog();
    assert_eq!((event.kind.as_str(), event.version), (E::TIPO, E::VERSION));
    catalog
        .validate(&event.kind, event.version, &event.payload)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", event.kind, event.payload));
    let typed: E = entrega::contracts::read(event.payload.clone()).unwrap();
    assert_eq!(
        serde_json::to_value(&typed).unwrap(),
        event.payload,
        "{}",
        E::TIPO
    );
    typed
}

fn order(address: bool, card: bool) -> NewOrder {
    let mut body = json!({"id": "P-1", "cliente": "ana", "mercado": "girona",
        "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}]});
    if address {
        body["direccion_entrega"] =
            json!({"ciudad": "Girona", "codigo_postal": "17001", "calle": "Carrer Nou 1"});
    }
    if card {
        body["tarjeta"] = json!("tok_visa");
    }
    NewOrder::from_json(&body).unwrap()
}

#[test]
fn what_the_services_write_meets_its_contract() {
    let plain: orders::OrderCreated = meets(&order_created(&order(false, false)));
    assert_eq!(plain.reservation, None);
    let saga: orders::OrderCreated = meets(&order_created_in_saga(&order(true, true)));
    assert_eq!(saga.reservation.as_deref(), Some("reserva-P-1"));
    assert_eq!(saga.address.unwrap().city, "Girona");

    let reserve = ReserveCommand {
        order_id: "P-1".into(),
        reservation_id: "reserva-P-1".into(),
        lines: vec![StockLine {
            product: "queso-curado".into(),
            quantity: 2,
        }],
    };
    let _: stock::Reserve = meets(&reserve.event());
    let _: stock::Reserved = meets(&reservation_answer(&reserve, None));
    let refused: stock::ReservationRefused = meets(&reservation_answer(
        &reserve,
        Some("sin stock de queso-curado"),
    ));
    assert_eq!(refused.reason, "sin stock de queso-curado");
    let release = ReleaseCommand {
        order_id: "P-1".into(),
        reservation_id: "reserva-P-1".into(),
        key: "liberacion-P-1".into(),
    };
    let _: stock::Release = meets(&release.event());
    let _: stock::Released = meets(&km0::services::inventario::release_answer(&release));
    let moved: stock::StockUpdated = meets(&stock_updated(
        "queso-curado",
        5,
        3,
        Motive::Reservation,
        Some("P-1"),
    ));
    assert_eq!(moved.motive, stock::StockMotive::Reservation);
    assert_eq!(moved.order_id.as_deref(), Some("P-1"));
    let restocked: stock::StockUpdated =
        meets(&stock_updated("queso-curado", 3, 13, Motive::Restock, None));
    assert_eq!(restocked.motive, stock::StockMotive::Restock);
    assert_eq!(restocked.order_id, None);

    let charge = OrderToCharge {
        order_id: "P-1".into(),
        amount_cents: 2900,
        card: "tok_visa".into(),
    };
    let _: payments::Charge = meets(&charge_command(&charge));
    let refund = RefundRequest {
        order_id: "P-1".into(),
        key: "reembolso-P-1".into(),
    };
    let _: payments::Refund = meets(&refund_command(&refund));

    let assign = AssignCommand {
        order_id: "P-1".into(),
        key: "reparto-P-1".into(),
        city: "Girona".into(),
        street: "Carrer Nou 1".into(),
    };
    let _: km0::contracts::delivery::Assign = meets(&assign.event());
    let _: km0::contracts::delivery::Assigned = meets(&assigned_event("P-1", "reparto-P-1", "R-1"));
    let _: km0::contracts::delivery::AssignmentRefused = meets(&refused_event(
        "P-1",
        "reparto-P-1",
        "ciudad_no_cubierta: Lleida",
    ));

    // The authorisation's reply is a bare body, checked against its contract the same way.
    let catalog = contracts::catalog();
    for reply in [
        Authorisation::Granted("AUT-1".into())
            .to_json("P-1")
            .unwrap(),
        Authorisation::Refused("importe_excede_limite".into())
            .to_json("P-1")
            .unwrap(),
    ] {
        catalog
            .validate("pagos.autorizaciones.respuesta", 1, &reply)
            .unwrap_or_else(|e| panic!("{e}: {reply}"));
    }
}

#[test]
fn a_payload_that_breaks_its_contract_is_named_by_field() {
    let catalog = contracts::catalog();
    let mut event = order_created(&order(false, false)).unwrap();
    event.payload["lineas"][0]["cantidad"] = json!("dos");
    let error = catalog
        .validate(&event.kind, event.version, &event.payload)
        .unwrap_err();
    assert_eq!(error.field(), Some("lineas[0].cantidad"));
}

#[test]
fn the_committed_asyncapi_document_is_the_generated_one() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/asyncapi.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = entrega::contracts::to_yaml(&contracts::asyncapi());
    assert!(
        committed == generated,
        "docs/asyncapi.yaml is not what the contracts generate: run \
         `km0 contracts asyncapi --out docs/asyncapi.yaml`"
    );
    // Every contract of every listed channel is described, on its channel.
    let doc = contracts::asyncapi();
    for contract in contracts::catalog().contracts() {
        let id = format!("{}_v{}", contract.tipo.replace('.', "_"), contract.version);
        let message = &doc["components"]["messages"][&id];
        assert_eq!(message["name"], contract.tipo.as_str(), "{id}");
        let channel = contract.channel.replace('.', "_");
        assert!(
            doc["channels"][&channel]["messages"].get(&id).is_some(),
            "{id} on {channel}"
        );
    }
}

/// `pedido.creado` version 2 is the seed's envelope example (section 8), member for member;
/// version 1 cannot read it (its address has a street and no postal code): the bump was due.
/// Both directions of the upcaster and the copy published during a transition hold.
#[test]
fn version_2_is_the_seeds_example_and_version_1_reaches_it_by_upcasting() {
    let catalog = contracts::catalog();
    let example = json!({
        "id": "P-2026-000123",
        "cliente": "ana",
        "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}],
        "direccion_entrega": {"ciudad": "Girona", "codigo_postal": "17001"}
    });
    catalog.validate("pedido.creado", 2, &example).unwrap();
    let as_v1 = catalog.validate("pedido.creado", 1, &example).unwrap_err();
    assert!(as_v1.to_string().contains("direccion_entrega"), "{as_v1}");

    // The seed's version 1 (no address, no market) upcasts to a valid version 2.
    let seed_v1 = json!({"id": "P-1", "cliente": "ana",
        "lineas": [{"producto": "calabacin", "cantidad": 1, "precio_centimos": 250}]});
    catalog.validate("pedido.creado", 1, &seed_v1).unwrap();
    let up = contracts::upcasters()
        .upcast("pedido.creado", 1, 2, seed_v1.clone())
        .unwrap();
    catalog.validate("pedido.creado", 2, &up).unwrap();
    // A version 1 address has no postal code to carry over: refused, naming it.
    let mut with_address = seed_v1;
    with_address["direccion_entrega"] = json!({"ciudad": "Girona", "calle": "Carrer Nou 1"});
    let refused = contracts::upcasters()
        .upcast("pedido.creado", 1, 2, with_address)
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("direccion_entrega.codigo_postal"),
        "{refused}"
    );

    // During a transition, pedidos' version 2 is also published as a valid version 1.
    let transitions = contracts::transitions(&["pedido.creado".to_owned()]).unwrap();
    let placed = order_created(&order(true, true)).unwrap();
    let (version, older) = transitions
        .older_copy("pedido.creado", 2, &placed.payload)
        .unwrap();
    assert_eq!(version, 1);
    catalog.validate("pedido.creado", 1, &older).unwrap();
    assert!(contracts::transitions(&["pedido.pagado".to_owned()]).is_err());
}
