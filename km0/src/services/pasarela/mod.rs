//! `pasarela`: a payment gateway simulator with a ledger of its own, so a test can prove how
//! many times each order was charged. It keeps Idempotency-Key semantics (the same key and
//! body get the stored answer, another body 422, a key still in use 409) and injects the
//! faults a run asks for: latency, 503 before charging, an answer that comes too late after
//! charging, declines by card or amount. Refunds give a charge back once, under their own
//! keys.

pub mod api;
mod component;
mod db;
mod domain;
mod http;
mod refunds;

pub use component::{Pasarela, COMPONENT, DATABASE};
pub use db::{Charge, ChargeLookup, Ledger, ReferenceTotals, Refund, Taken};
pub use domain::{ChargeRequest, Decision, Faults, InvalidCharge, RefundRequest};
pub use http::{app, openapi, PasarelaState, KEY_LEASE_MS};
