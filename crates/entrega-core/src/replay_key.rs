//! The key that makes `entrega-only-group` trustworthy. A replay meant for one consumer group
//! makes every other group acknowledge the record without handling it; if anyone able to
//! publish could set that header, anyone could make a consumer skip any record. So the header
//! counts only with a signature made with a secret the operators' tool and the consumers
//! share: HMAC-SHA256 over the group, the record's key and its payload, each length-prefixed.
//! A signature copied onto another record does not verify.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::headers::{ONLY_GROUP, ONLY_GROUP_SIGNATURE};
use crate::{Headers, OutgoingMessage};

type HmacSha256 = Hmac<Sha256>;

/// Shortest secret accepted, in bytes.
pub const MIN_REPLAY_KEY_BYTES: usize = 16;

/// A replay key that is too short to be a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a replay key needs at least {MIN_REPLAY_KEY_BYTES} bytes, got {got}")]
pub struct ShortReplayKey {
    /// The length given.
    pub got: usize,
}

/// The shared secret that signs and verifies replays to one group. Its `Debug` never shows
/// the secret.
#[derive(Clone)]
pub struct ReplayKey(Vec<u8>);

impl std::fmt::Debug for ReplayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplayKey(<redacted>)")
    }
}

impl ReplayKey {
    /// A key from its secret bytes (at least [`MIN_REPLAY_KEY_BYTES`]).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, ShortReplayKey> {
        let secret = secret.as_ref();
        if secret.len() < MIN_REPLAY_KEY_BYTES {
            return Err(ShortReplayKey { got: secret.len() });
        }
        Ok(Self(secret.to_vec()))
    }

    fn mac(&self, group: &str, key: Option<&str>, payload: &[u8]) -> HmacSha256 {
        // HMAC takes a key of any length, so this cannot fail; an empty-keyed MAC would only
        // ever be produced for a key `new` refused.
        let mut mac = HmacSha256::new_from_slice(&self.0)
            .unwrap_or_else(|_| <HmacSha256 as Mac>::new(&Default::default()));
        for part in [
            group.as_bytes(),
            key.map_or(&[][..], str::as_bytes),
            payload,
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        // A missing key and an empty one differ.
        mac.update(&[u8::from(key.is_some())]);
        mac
    }

    /// The signature of a replay of (`key`, `payload`) to `group`, as lowercase hex.
    pub fn sign(&self, group: &str, key: Option<&str>, payload: &[u8]) -> String {
        let bytes = self.mac(group, key, payload).finalize().into_bytes();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Marks `message` as meant for `group` only: sets `entrega-only-group` and its signature.
    pub fn stamp(&self, message: &mut OutgoingMessage, group: &str) {
        let signature = self.sign(group, message.key.as_deref(), &message.payload);
        message.headers.remove_current(ONLY_GROUP);
        message.headers.remove_current(ONLY_GROUP_SIGNATURE);
        message.headers.set(ONLY_GROUP, group);
        message.headers.set(ONLY_GROUP_SIGNATURE, signature);
    }

    /// The group a record is meant for, when its `entrega-only-group` carries a signature this
    /// key verifies (in constant time); `None` for a record without the header, and
    /// `Some(Err(()))` for one whose header is unsigned or wrongly signed.
    pub fn solo_group<'a>(
        &self,
        headers: &'a Headers,
        key: Option<&str>,
        payload: &[u8],
    ) -> Option<Result<&'a str, ()>> {
        let group = headers.get_current(ONLY_GROUP)?;
        let Some(signature) = headers
            .get_current(ONLY_GROUP_SIGNATURE)
            .and_then(decode_hex)
        else {
            return Some(Err(()));
        };
        let verified = self
            .mac(group, key, payload)
            .verify_slice(&signature)
            .is_ok();
        Some(if verified { Ok(group) } else { Err(()) })
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn message(key: Option<&str>, payload: &[u8]) -> OutgoingMessage {
        OutgoingMessage {
            topic: "pedidos.eventos".into(),
            key: key.map(str::to_owned),
            headers: Headers::new(),
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn a_stamped_message_verifies_for_its_group() {
        let k = ReplayKey::new("0123456789abcdef-secret").unwrap();
        let mut m = message(Some("P-1"), b"{\"n\":1}");
        k.stamp(&mut m, "analitica");
        assert_eq!(
            k.solo_group(&m.headers, Some("P-1"), &m.payload),
            Some(Ok("analitica"))
        );
    }

    #[test]
    fn forged_copied_or_unsigned_headers_do_not_verify() {
        let k = ReplayKey::new("0123456789abcdef-secret").unwrap();
        let other = ReplayKey::new("another-secret-of-16+").unwrap();
        let mut m = message(Some("P-1"), b"{\"n\":1}");
        other.stamp(&mut m, "analitica");
        assert_eq!(
            k.solo_group(&m.headers, Some("P-1"), &m.payload),
            Some(Err(()))
        );
        k.stamp(&mut m, "analitica");
        // The same signature on another payload, key or group.
        assert_eq!(
            k.solo_group(&m.headers, Some("P-1"), b"{\"n\":2}"),
            Some(Err(()))
        );
        assert_eq!(
            k.solo_group(&m.headers, Some("P-2"), &m.payload),
            Some(Err(()))
        );
        assert_eq!(k.solo_group(&m.headers, None, &m.payload), Some(Err(())));
        let mut moved = m.headers.clone();
        moved.set(ONLY_GROUP, "inventario");
        assert_eq!(k.solo_group(&moved, Some("P-1"), &m.payload), Some(Err(())));
        for bad in ["", "zz", "abc", "ñ0"] {
            let mut h = m.headers.clone();
            h.set(ONLY_GROUP_SIGNATURE, bad);
            assert_eq!(
                k.solo_group(&h, Some("P-1"), &m.payload),
                Some(Err(())),
                "{bad}"
            );
        }
        let mut unsigned = Headers::new();
        unsigned.set(ONLY_GROUP, "analitica");
        assert_eq!(
            k.solo_group(&unsigned, Some("P-1"), &m.payload),
            Some(Err(()))
        );
        assert_eq!(k.solo_group(&Headers::new(), Some("P-1"), &m.payload), None);
    }

    #[test]
    fn short_keys_are_refused_and_never_printed() {
        assert_eq!(
            ReplayKey::new("short").unwrap_err(),
            ShortReplayKey { got: 5 }
        );
        let k = ReplayKey::new("0123456789abcdef-secret").unwrap();
        assert!(!format!("{k:?}").contains("secret"));
    }
}
