//! The seed's Python services beside km0 on Kafka: the script runner and km0 processes with their databases.

pub mod km0_kafka;
pub mod python;
