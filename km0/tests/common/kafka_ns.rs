//! A namespace of a test's own on the suite's shared Kafka (`ENTREGA_TEST_KAFKA`): km0 puts
//! it before every topic, group and transactional id (`?namespace=`), so km0's fixed names
//! (`pedidos.eventos`, `inventario`) never meet another test's or another run's. Everything
//! under it is deleted when dropped (the test failed or not), as km0's own fresh runs do.
//!
//! For tests that need a broker to themselves (to stop it, proxy it, secure it, or fill the
//! shared topics with foreign records) there is [`super::kafka::KafkaBroker`].

use std::time::Duration;

/// The shared broker's `host:port`.
pub fn shared_bootstrap() -> String {
    std::env::var("ENTREGA_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// A fresh namespace on the shared broker.
pub struct KafkaNamespace {
    bootstrap: String,
    prefix: String,
}

impl KafkaNamespace {
    /// `km0-t<uuid>.` on [`shared_bootstrap`].
    pub fn new() -> Self {
        Self {
            bootstrap: shared_bootstrap(),
            prefix: format!("km0-t{}.", uuid::Uuid::new_v4().simple()),
        }
    }

    /// `kafka://<shared broker>?namespace=<prefix>`, for km0's `--broker`.
    pub fn url(&self) -> String {
        format!("kafka://{}?namespace={}", self.bootstrap, self.prefix)
    }

    /// [`KafkaNamespace::url`] with more parameters (`session_timeout_ms=6000`).
    pub fn url_with(&self, params: &str) -> String {
        format!("{}&{params}", self.url())
    }

    /// The broker's `host:port`, for librdkafka's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The name km0's `name` (a topic, a group) has on the broker.
    pub fn wire(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

impl Default for KafkaNamespace {
    fn default() -> Self {
        Self::new()
    }
}

/// How long removing a namespace is tried: a group whose member was killed cannot be deleted
/// until the member's session times out (6 s in the tests that kill processes).
const REMOVE_WITHIN: Duration = Duration::from_secs(30);

impl Drop for KafkaNamespace {
    /// Deletes the namespace's topics and groups, on a thread of its own (a test's runtime
    /// may be gone, or be the one dropping this), trying again while a group still has a
    /// member.
    fn drop(&mut self) {
        let url = self.url();
        let removed = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to remove the namespace");
            runtime.block_on(async {
                let broker = entrega::Broker::connect(&url, Duration::from_secs(10))
                    .await
                    .map_err(|e| e.to_string())?;
                let removed = broker.remove_namespace_within(REMOVE_WITHIN).await;
                broker.close().await;
                removed.map(drop).map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(e)) = removed {
            eprintln!("removing the test's Kafka namespace failed: {e}");
        }
    }
}
