//! The vocabulary's tests: envelope parsing and its limits, and the outbox's defaults.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod envelope;
mod outbox_defaults;
mod renamed_headers;
