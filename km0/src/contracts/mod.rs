//! km0's contracts: every event, command, reply and request body its services exchange, as a
//! type that knows its `tipo` and `version` (ADR 0019). [`catalog`] lists them with the channel
//! each travels on; their schemas are committed under `contracts/` and checked in CI
//! (`km0 contracts check`); [`asyncapi`] describes them for other teams (`docs/asyncapi.yaml`).

pub mod delivery;
pub mod orders;
pub mod payments;
pub mod registry;
pub mod sales;
pub mod stock;

use std::sync::OnceLock;

use entrega::contracts::asyncapi::{Channel, Info};
use entrega::contracts::transition;
use entrega::{Catalog, Event, Headers, Transitions, Upcasters};

use crate::services::{analitica, inventario, pagos, pedidos, reparto};

/// The CloudEvents `dataschema` of km0's events: `urn:km0:contract:<tipo>:v<version>`, the
/// contract committed as `contracts/<tipo>/v<version>.json`.
pub const SCHEMA_BASE: &str = "urn:km0:contract:";

/// Where the committed contracts live, relative to the repository's root.
pub const DIRECTORY: &str = "contracts";

/// How km0's consumers read older versions: `pedido.creado` version 1 becomes version 2
/// ([`orders::order_created_v1_to_v2`]).
pub fn upcasters() -> &'static Upcasters {
    static UPCASTERS: OnceLock<Upcasters> = OnceLock::new();
    UPCASTERS.get_or_init(|| {
        Upcasters::new().step(
            orders::OrderCreated::TIPO,
            1,
            orders::order_created_v1_to_v2,
        )
    })
}

/// Whether a delivered event, published at several versions during a transition (its
/// [`VERSIONS`](entrega::contracts::transition::VERSIONS) header lists them), is a copy a
/// consumer reading `V` leaves to the copy it reads: acknowledged without effect.
pub fn is_other_copy<V: entrega::View>(headers: &Headers, version: u32) -> bool {
    let listed = transition::listed_versions(headers.get(transition::VERSIONS));
    listed.len() > 1
        && transition::chosen_version::<V>(upcasters(), &listed).is_some_and(|c| c != version)
}

/// The event types km0's producers publish at both versions during a transition, by name
/// (`pedido.creado`): each is published as its current version and the one before.
pub fn transitions(publish_both: &[String]) -> Result<Transitions, String> {
    publish_both
        .iter()
        .try_fold(Transitions::new(), |transitions, tipo| {
            match tipo.as_str() {
                orders::OrderCreated::TIPO => Ok(transitions.publish_also(
                    orders::OrderCreated::TIPO,
                    orders::OrderCreated::VERSION,
                    orders::OrderCreatedV1::VERSION,
                    orders::order_created_v2_to_v1,
                )),
                other => Err(format!(
                    "`{other}` has no older version to publish beside its own (known: {})",
                    orders::OrderCreated::TIPO
                )),
            }
        })
}

/// Every contract of km0, by channel.
pub fn catalog() -> Catalog {
    Catalog::new()
        .event::<orders::OrderCreatedV1>(
            pedidos::TOPIC,
            "An order was placed (the seed's pedidos and km0 before version 2).",
        )
        .event::<orders::OrderCreated>(
            pedidos::TOPIC,
            "An order was placed (the order as the client sent it).",
        )
        .event::<orders::OrderPaidV1>(pedidos::TOPIC, "An order was paid (the seed's pagos).")
        .event::<orders::OrderPaid>(
            pedidos::TOPIC,
            "An order was paid and a courier assigned (the order saga).",
        )
        .event::<orders::OrderCancelled>(pedidos::TOPIC, "The order saga gave an order up.")
        .event::<stock::Reserve>(inventario::COMMANDS_TOPIC, "Set units aside for an order.")
        .event::<stock::Release>(inventario::COMMANDS_TOPIC, "Give a reservation back.")
        .event::<stock::Reserved>(inventario::EVENTS_TOPIC, "The units are set aside.")
        .event::<stock::ReservationRefused>(inventario::EVENTS_TOPIC, "Nothing was set aside.")
        .event::<stock::Released>(inventario::EVENTS_TOPIC, "The reservation was given back.")
        .event::<stock::StockUpdated>(inventario::EVENTS_TOPIC, "A product's units changed.")
        .event::<payments::Charge>(pagos::COMMANDS_TOPIC, "Charge an order once.")
        .event::<payments::Refund>(pagos::COMMANDS_TOPIC, "Give an order's charge back.")
        .event::<payments::PaymentConfirmed>(
            pagos::EVENTS_TOPIC,
            "The gateway approved the charge.",
        )
        .event::<payments::PaymentDeclined>(pagos::EVENTS_TOPIC, "The charge was declined.")
        .event::<payments::PaymentRefunded>(pagos::EVENTS_TOPIC, "The charge was given back.")
        .event::<payments::AuthorisationRequest>(
            pagos::AUTHORISATIONS,
            "Authorise a card payment (request).",
        )
        .event::<payments::AuthorisationReply>(
            pagos::AUTHORISATIONS,
            "The authorisation, granted or refused (reply).",
        )
        .event::<delivery::Assign>(reparto::COMMANDS_TOPIC, "Find a courier for an order.")
        .event::<delivery::Assigned>(reparto::EVENTS_TOPIC, "A courier takes the order.")
        .event::<delivery::AssignmentRefused>(reparto::EVENTS_TOPIC, "No courier will take it.")
        .event::<delivery::CoverageRequest>(
            reparto::COVERAGE,
            "Which cities have couriers (request).",
        )
        .event::<delivery::CoverageReply>(reparto::COVERAGE, "The cities with couriers (reply).")
        .event::<sales::MarketSales>(
            analitica::OUTPUT_TOPIC,
            "Sales of a batch of orders in one market.",
        )
}

/// The channels km0's contracts travel on, with who sends and who receives there.
pub fn channels() -> Vec<Channel> {
    fn channel(
        address: &str,
        description: &str,
        key: Option<&str>,
        senders: &[&str],
        receivers: &[&str],
    ) -> Channel {
        Channel {
            address: address.to_owned(),
            description: description.to_owned(),
            key: key.map(str::to_owned),
            envelope: true,
            senders: senders.iter().map(|s| (*s).to_owned()).collect(),
            receivers: receivers.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
    let order = Some("The order id (`agregado_id`): one order's events stay in order.");
    let mut authorisations = channel(
        pagos::AUTHORISATIONS,
        "Card authorisations by request/reply (`reply_to`, `correlation_id`): bare JSON bodies, no envelope.",
        None,
        &["clients"],
        &["pagos"],
    );
    authorisations.envelope = false;
    let mut coverage = channel(
        reparto::COVERAGE,
        "The cities reparto delivers in, by request/reply: bare JSON bodies, no envelope.",
        None,
        &["pedidos"],
        &["reparto"],
    );
    coverage.envelope = false;
    vec![
        channel(
            pedidos::TOPIC,
            "The life of every order.",
            order,
            &["pedidos"],
            &["inventario", "pagos", "reparto", "analitica"],
        ),
        channel(
            inventario::COMMANDS_TOPIC,
            "The order saga's reservations and their releases.",
            order,
            &["pedidos"],
            &["inventario"],
        ),
        channel(
            inventario::EVENTS_TOPIC,
            "Answers to reservations (keyed by order) and stock changes (keyed by product).",
            Some("The order id for reservation answers, the product for stock changes."),
            &["inventario"],
            &["pedidos", "catalogo"],
        ),
        channel(
            pagos::COMMANDS_TOPIC,
            "The order saga's charges and refunds.",
            order,
            &["pedidos"],
            &["pagos"],
        ),
        channel(
            pagos::EVENTS_TOPIC,
            "Answers to charges and refunds.",
            order,
            &["pagos"],
            &["pedidos"],
        ),
        channel(
            reparto::COMMANDS_TOPIC,
            "The order saga's courier assignments.",
            order,
            &["pedidos"],
            &["reparto"],
        ),
        channel(
            reparto::EVENTS_TOPIC,
            "Answers to courier assignments.",
            order,
            &["reparto"],
            &["pedidos"],
        ),
        channel(
            analitica::OUTPUT_TOPIC,
            "Sales per market, written in a Kafka transaction with the offsets read.",
            Some("The market."),
            &["analitica"],
            &[],
        ),
        authorisations,
        coverage,
    ]
}

/// km0's HTTP APIs described in OpenAPI 3.1, by name, with the file each is committed as.
pub const HTTP_APIS: [(&str, &str); 3] = [
    ("pedidos", "docs/openapi.json"),
    ("pasarela", "docs/openapi-pasarela.json"),
    ("operations", "docs/openapi-operations.json"),
];

/// The OpenAPI 3.1 description of the HTTP API `api` ([`HTTP_APIS`]) as committed: pretty
/// JSON, one final newline; `None` for an API km0 does not have.
pub fn openapi_json(api: &str) -> Option<String> {
    let doc = match api {
        "pedidos" => crate::services::pedidos::openapi(),
        "pasarela" => crate::services::pasarela::openapi(),
        "operations" => crate::wiring::ops_openapi(),
        _ => return None,
    };
    let mut text = serde_json::to_string_pretty(&doc).ok()?;
    text.push('\n');
    Some(text)
}

/// km0's AsyncAPI 3.0 document (committed as `docs/asyncapi.yaml`).
pub fn asyncapi() -> serde_json::Value {
    let info = Info {
        title: "Kilómetro Cero".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        description: "Orders, stock, payments and delivery over entrega: the topics and queues \
                      km0's services exchange messages on, and what each message holds."
            .to_owned(),
    };
    entrega::contracts::asyncapi::document(&catalog(), &info, &channels())
}
