//! `pagos`: card authorisations over request/reply (`pagos.autorizaciones`, the seed's
//! contract), and the charge of each created order at the payment gateway, once, as the
//! seed's exercise 1 asks it fixed: commits after processing, a deterministic
//! Idempotency-Key (`cobro-<pedido_id>`), no transaction open across the HTTP call, and the
//! `pagos` row written with its `pago.confirmado` / `pago.rechazado` in one transaction.
//! For the order saga it takes the same charge as a command (`pagos.cobrar`), and gives it
//! back (`pagos.reembolsar`) under the refund's own key.

mod commands;
mod component;
mod db;
mod domain;
mod gateway;
mod messaging;
mod refunds;

pub use commands::{
    charge_command, refund_command, CommandConsumer, CHARGE, COMMANDS_CONSUMER, COMMANDS_GROUP,
    COMMANDS_TOPIC, COMMAND_AGGREGATE, REFUND,
};
pub use component::{Pagos, COMPONENT, DATABASE, DEFAULT_PASARELA_URL};
pub use db::{
    ChargeOutcome, ChargeStart, Payment, PaymentState, PaymentStore, AGGREGATE, BEFORE_COMMIT,
    CONSUMER, PAYMENT_CONFIRMED, PAYMENT_DECLINED,
};
pub use domain::{
    Authorisation, AuthorisationRequest, InvalidRequest, NotChargeable, OrderToCharge,
    AUTHORISATION_LIMIT_CENTS,
};
pub use gateway::{
    Gateway, GatewayError, QUICK_TRIES as GATEWAY_QUICK_TRIES, TIMEOUT as GATEWAY_TIMEOUT,
};
pub use messaging::{
    server_config, Authoriser, ChargeConsumer, AUTHORISATIONS, AUTHORISER, EVENTS_TOPIC, GROUP,
    TOPIC,
};
pub use refunds::{RefundOutcome, RefundRequest, RefundStart, PAYMENT_REFUNDED};

/// The outbox routing of pagos: payment events to `pagos.eventos`.
pub fn routing() -> entrega::TopicRouting {
    entrega::TopicRouting::new().route(AGGREGATE, EVENTS_TOPIC)
}

/// The source name in pagos' envelopes (`origen`).
pub const SOURCE: &str = "pagos";
