//! entrega's own stores, written once over the database layer, on SQLite and PostgreSQL:
//! the testkit's conformance suites and each store's own scenarios.

mod conformance;
mod inbox;
mod outbox;
mod seed_compat;
