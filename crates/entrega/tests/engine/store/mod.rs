//! entrega's own stores, written once over the database layer, on SQLite and PostgreSQL:
//! the testkit's conformance suites and each store's own scenarios.

mod backend_db;
mod concurrent_writers;
mod conformance;
mod inbox;
mod log_groups;
mod log_postgres;
mod log_sqlite;
mod migrations;
mod outbox;
mod seed_compat;
