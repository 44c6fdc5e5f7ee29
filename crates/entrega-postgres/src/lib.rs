//! entrega on postgres.
