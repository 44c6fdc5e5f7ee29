//! The entrega engine.
