//! A namespace: a prefix a transport puts before every topic, group and queue name it sends to
//! a shared broker, so that one deployment (a demo run, a test) never reads, commits or
//! consumes what another wrote. Code above the transport keeps the plain names: records come
//! back with their topic as the caller named it.

/// The longest prefix accepted: brokers cap names (Kafka at 249 characters, RabbitMQ at 255
/// bytes) and the prefix must leave room for the names it goes before.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// A prefix kept apart from everything else on a broker; empty (the default) means none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Namespace(String);

/// Why a namespace was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "namespace `{given}` is not 1 to {MAX_NAMESPACE_LEN} characters of ASCII letters, digits, \
     `.`, `_` and `-`"
)]
pub struct InvalidNamespace {
    /// The namespace as given, with control characters escaped.
    pub given: String,
}

impl Namespace {
    /// `prefix` as a namespace; names become `<prefix><name>`, so a prefix usually ends with a
    /// separator (`demo-3f2a.`). Only characters every broker accepts in a name are allowed.
    pub fn new(prefix: &str) -> Result<Self, InvalidNamespace> {
        let valid = !prefix.is_empty()
            && prefix.len() <= MAX_NAMESPACE_LEN
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(Self(prefix.to_owned()))
        } else {
            Err(InvalidNamespace {
                given: prefix.escape_default().to_string(),
            })
        }
    }

    /// No namespace: names go to the broker as they are.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether names go to the broker as they are.
    pub fn is_none(&self) -> bool {
        self.0.is_empty()
    }

    /// The prefix (empty without a namespace).
    pub fn prefix(&self) -> &str {
        &self.0
    }

    /// The name the broker knows for `name`.
    pub fn wire(&self, name: &str) -> String {
        let mut wire = String::with_capacity(self.0.len() + name.len());
        wire.push_str(&self.0);
        wire.push_str(name);
        wire
    }

    /// The name callers know for the broker's `wire` name: the prefix removed. A name from
    /// outside the namespace is returned as it is.
    pub fn local<'a>(&self, wire: &'a str) -> &'a str {
        wire.strip_prefix(self.0.as_str()).unwrap_or(wire)
    }

    /// Whether the broker's `wire` name belongs to this namespace (every name does without
    /// one).
    pub fn owns(&self, wire: &str) -> bool {
        wire.starts_with(self.0.as_str())
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_go_out_prefixed_and_come_back_plain() {
        let ns = Namespace::new("demo-3f2a.").unwrap();
        assert_eq!(ns.wire("pedidos.eventos"), "demo-3f2a.pedidos.eventos");
        assert_eq!(ns.local("demo-3f2a.pedidos.eventos"), "pedidos.eventos");
        assert_eq!(ns.local("pedidos.eventos"), "pedidos.eventos");
        assert!(ns.owns("demo-3f2a.pagos"));
        assert!(!ns.owns("pagos"));
    }

    #[test]
    fn no_namespace_changes_nothing() {
        let ns = Namespace::none();
        assert!(ns.is_none());
        assert_eq!(ns.wire("pagos"), "pagos");
        assert_eq!(ns.local("pagos"), "pagos");
        assert!(ns.owns("anything"));
    }

    #[test]
    fn characters_a_broker_refuses_are_refused() {
        for bad in [
            "",
            "a b",
            "demo/x",
            "x\u{1b}[2J",
            &"n".repeat(MAX_NAMESPACE_LEN + 1),
        ] {
            let err = Namespace::new(bad).unwrap_err();
            assert!(!err.given.contains('\u{1b}'), "escaped: {err}");
        }
        assert!(Namespace::new(&"n".repeat(MAX_NAMESPACE_LEN)).is_ok());
    }
}
