//! The delivery suite of `entrega-testkit` (the contract logs and queues share, with no
//! offsets) on every broker `entrega::Broker::connect` opens: the log transport in SQLite and
//! in PostgreSQL (`ENTREGA_TEST_PG`), and RabbitMQ (`ENTREGA_TEST_AMQP`). RabbitMQ cannot run
//! the log suite: it keeps no offsets to commit, read or replay from.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::{Broker, Db};
use entrega_core::{MigrationSet, Publisher, Subscriber, TopicAdmin};
use entrega_testkit::{BoxError, DeliveryFixture, DeliveryHarness, Scenario};
use support::TempDir;

/// A log member silent this long loses its partitions.
const LEASE_TTL: Duration = Duration::from_secs(2);

/// One broker opened for one scenario, and what to drop after it.
struct BrokerFixture {
    broker: Broker,
    db: Option<Db>,
    drop_pg: Option<String>,
    _dir: Option<TempDir>,
}

#[async_trait]
impl DeliveryFixture for BrokerFixture {
    fn publisher(&self) -> Arc<dyn Publisher> {
        self.broker.publisher()
    }

    fn subscriber(&self) -> Arc<dyn Subscriber> {
        self.broker.subscriber()
    }

    fn admin(&self) -> Arc<dyn TopicAdmin> {
        self.broker.admin()
    }

    async fn remove(&self, group: &str, topic: &str) -> Scenario {
        if let Some(amqp) = self.broker.as_amqp() {
            amqp.delete_group(group, topic).await?;
        }
        Ok(())
    }

    async fn teardown(self: Box<Self>) -> Scenario {
        self.broker.close().await;
        if let Some(db) = &self.db {
            db.close().await;
        }
        if let Some(name) = &self.drop_pg {
            support::pg::drop_database(name).await;
        }
        Ok(())
    }
}

/// Which broker the scenarios run on.
#[derive(Clone, Copy)]
enum Kind {
    SqliteLog,
    PostgresLog,
    Rabbitmq,
}

struct Harness(Kind);

#[async_trait]
impl DeliveryHarness for Harness {
    async fn fixture(&self) -> Result<Box<dyn DeliveryFixture>, BoxError> {
        Ok(Box::new(match self.0 {
            Kind::SqliteLog => {
                let dir = TempDir::new();
                let db = Db::connect(&dir.url("broker.db")).await?;
                db.migrate(&[MigrationSet::Log]).await?;
                BrokerFixture {
                    broker: Broker::log(&db, LEASE_TTL),
                    db: Some(db),
                    drop_pg: None,
                    _dir: Some(dir),
                }
            }
            Kind::PostgresLog => {
                let name = format!("entrega_t_{}", uuid::Uuid::new_v4().simple());
                let url =
                    entrega_postgres::ensure_database(&support::pg::server_url(), &name).await?;
                let db = Db::connect(&url).await?;
                db.migrate(&[MigrationSet::Log]).await?;
                BrokerFixture {
                    broker: Broker::log(&db, LEASE_TTL),
                    db: Some(db),
                    drop_pg: Some(name),
                    _dir: None,
                }
            }
            Kind::Rabbitmq => {
                let base = std::env::var("ENTREGA_TEST_AMQP")
                    .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
                BrokerFixture {
                    broker: Broker::connect(&format!("{base}?shards=3"), LEASE_TTL).await?,
                    db: None,
                    drop_pg: None,
                    _dir: None,
                }
            }
        }))
    }
}

mod sqlite_log {
    entrega_testkit::delivery_conformance!(super::Harness(super::Kind::SqliteLog));
}

mod postgres_log {
    entrega_testkit::delivery_conformance!(super::Harness(super::Kind::PostgresLog));
}

mod rabbitmq {
    entrega_testkit::delivery_conformance!(super::Harness(super::Kind::Rabbitmq));
}
