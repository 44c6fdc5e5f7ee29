//! entrega on sqlite.
