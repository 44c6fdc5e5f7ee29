//! The operator's commands: the outbox's backlog and parked rows (`km0 outbox`), consumer
//! lag (`km0 lag`, queue depths on RabbitMQ), dead letters (`km0 dlq`) and the order sagas
//! (`km0 saga`), the stock (`km0 stock`), and the event contracts (`km0 contracts`). Every action that changes state is recorded under the operating-system user
//! that ran it ([`identity::os_user`]).

pub mod contracts;
pub mod dlq;
pub mod identity;
pub mod lag;
pub mod outbox;
pub mod queue_lag;
pub mod saga;
pub mod stock;
pub mod terminal;
pub mod wal_slot;
