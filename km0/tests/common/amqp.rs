//! A RabbitMQ virtual host of a test's own on the shared broker (`ENTREGA_TEST_AMQP`), so
//! km0's fixed queue names (`inventario.pedidos.*`) never meet another test's; deleted, with
//! everything in it, when dropped.
//!
//! Tests of one binary run at once, and one of them stops and starts the shared broker
//! ([`Vhost::create_restartable`]): every other test that uses the broker holds a share of
//! [`BROKER_IN_USE`] for as long as its virtual host lives ([`Vhost::create`], [`shared`]),
//! and the restarting test waits for all of them to finish and keeps them out meanwhile.

use std::process::Command;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Held shared by the tests using the local RabbitMQ, exclusively by the one restarting it.
pub static BROKER_IN_USE: RwLock<()> = RwLock::new(());

/// The shared broker, kept running while the guard lives (for tests that use the default
/// virtual host, as the seed's own scripts do).
pub fn shared() -> RwLockReadGuard<'static, ()> {
    BROKER_IN_USE
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The broker's use by a virtual host: shared, or exclusive for a test that restarts it.
enum Use {
    Shared(RwLockReadGuard<'static, ()>),
    Exclusive(RwLockWriteGuard<'static, ()>),
}

/// A fresh virtual host on the local RabbitMQ, `guest` allowed everything in it.
pub struct Vhost {
    name: String,
    // Released after `drop` deleted the virtual host.
    _use: Use,
}

fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("run rabbitmqctl");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The broker tests use, without a virtual host.
pub fn base_url() -> String {
    std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
        .trim_end_matches('/')
        .to_owned()
}

impl Vhost {
    pub fn create() -> Self {
        Self::with_use(Use::Shared(shared()))
    }

    /// A virtual host for a test that stops and starts the broker: it waits until no other
    /// test uses the broker, and keeps them waiting until it is dropped.
    pub fn create_restartable() -> Self {
        let exclusive = BROKER_IN_USE
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Self::with_use(Use::Exclusive(exclusive))
    }

    fn with_use(broker_use: Use) -> Self {
        let name = format!("km0-test-{}", uuid::Uuid::new_v4().simple());
        rabbitmqctl(&["add_vhost", &name]);
        rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]);
        Self {
            name,
            _use: broker_use,
        }
    }

    /// `amqp://…/<vhost>`, without parameters.
    pub fn url(&self) -> String {
        format!("{}/{}", base_url(), self.name)
    }
}

impl Vhost {
    /// The lines `rabbitmqctl list_<what>` prints for `columns` in this virtual host,
    /// without headers or blank lines.
    fn list(&self, what: &str, columns: &[&str]) -> Vec<String> {
        let out = Command::new("rabbitmqctl")
            .args(["-q", &format!("list_{what}"), "-p", &self.name])
            .args(columns)
            .arg("--no-table-headers")
            .output()
            .expect("run rabbitmqctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_owned())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The names of the queues in this virtual host.
    pub fn queues(&self) -> Vec<String> {
        self.list("queues", &["name"])
    }

    /// The names of the exchanges in this virtual host (the default one's name is empty).
    pub fn exchanges(&self) -> Vec<String> {
        self.list("exchanges", &["name"])
    }

    /// The consumer tags that are active (delivered to) on some queue of this virtual host.
    pub fn active_consumer_tags(&self) -> Vec<String> {
        self.list("consumers", &["consumer_tag", "active"])
            .iter()
            .filter_map(|l| {
                let mut fields = l.split_whitespace();
                let tag = fields.next()?;
                (fields.next() == Some("true")).then(|| tag.to_owned())
            })
            .collect()
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_vhost", &self.name])
            .output();
    }
}
