//! What makes `POST /pedidos` idempotent: each order keeps a fingerprint of the request that
//! created it, the answer it was given (its `id_evento`) and the request's `Idempotency-Key`,
//! written in the order's transaction. A request that meets an existing order (by id, or by
//! key) is answered from them: the same request gets the original answer again, a different
//! one is a conflict.

use entrega::db::{query, Migration, Tx};
use entrega_core::StoreError;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use super::db::{CreateOrderError, OrderStore};
use super::domain::NewOrder;

/// The table of the requests that created orders (ours, not the seed's: the seed's services
/// never read it, and orders they create have no row).
pub(super) const MIGRATION: Migration = Migration::same(
    2,
    "order_requests: the request and answer that created each order",
    "CREATE TABLE IF NOT EXISTS order_requests (
        order_id        TEXT PRIMARY KEY REFERENCES pedidos (id),
        fingerprint     TEXT NOT NULL,
        event_id        TEXT NOT NULL,
        idempotency_key TEXT UNIQUE);",
);

/// The longest `Idempotency-Key` accepted.
pub const MAX_KEY_LEN: usize = 255;

/// Whether `key` is a usable `Idempotency-Key`: 1 to [`MAX_KEY_LEN`] visible ASCII
/// characters.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic())
}

/// The fingerprint of an order request: SHA-256 of the validated order as JSON (so spacing
/// and key order in the body do not matter; everything the order says does).
pub fn fingerprint(order: &NewOrder) -> String {
    let json = serde_json::to_vec(order).unwrap_or_default();
    Sha256::digest(&json)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How an order request that met an existing order is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EarlierAnswer {
    /// The same request created the order: its answer again (the event id).
    Same(Uuid),
    /// Something else holds the id or the key: which (`id` or `Idempotency-Key`) and why,
    /// for the 409.
    Conflict {
        /// `id` or `Idempotency-Key`.
        field: &'static str,
        /// What holds it.
        why: String,
    },
}

/// Records the request that created `order` in its transaction; a key already used by another
/// order fails the whole creation.
pub(super) async fn record(
    tx: &mut Tx,
    order: &NewOrder,
    event_id: Uuid,
    key: Option<&str>,
) -> Result<(), CreateOrderError> {
    let inserted = tx
        .execute(
            query(
                "INSERT INTO order_requests (order_id, fingerprint, event_id, idempotency_key) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(&order.id)
            .bind(fingerprint(order))
            .bind(event_id.to_string())
            .bind(key),
        )
        .await?;
    match (inserted, key) {
        (1, _) => Ok(()),
        (_, Some(key)) => Err(CreateOrderError::KeyTaken {
            key: key.to_owned(),
        }),
        (_, None) => Err(CreateOrderError::Duplicate {
            id: order.id.clone(),
        }),
    }
}

impl OrderStore {
    /// The answer for `order` (sent with `key`) that met an order already there: the key's
    /// order if the key was used, else the order of the same id.
    pub async fn earlier_answer(
        &self,
        order: &NewOrder,
        key: Option<&str>,
    ) -> Result<EarlierAnswer, StoreError> {
        type Row = (String, String, String);
        let by_key: Option<Row> = match key {
            Some(key) => {
                self.db()
                    .fetch_optional(
                        query(
                            "SELECT order_id, fingerprint, event_id FROM order_requests \
                             WHERE idempotency_key = $1",
                        )
                        .bind(key),
                    )
                    .await?
            }
            None => None,
        };
        let by_key_found = by_key.is_some();
        let found = match by_key {
            Some(row) => Some(row),
            None => {
                self.db()
                    .fetch_optional(
                        query(
                            "SELECT order_id, fingerprint, event_id FROM order_requests \
                             WHERE order_id = $1",
                        )
                        .bind(&order.id),
                    )
                    .await?
            }
        };
        let Some((order_id, stored, event_id)) = found else {
            return Ok(EarlierAnswer::Conflict {
                field: "id",
                why: format!("order {} already exists", order.id),
            });
        };
        if stored != fingerprint(order) {
            return Ok(match key {
                Some(key) if by_key_found => EarlierAnswer::Conflict {
                    field: "Idempotency-Key",
                    why: format!(
                        "Idempotency-Key {key} was used for a different request (order {order_id})"
                    ),
                },
                _ => EarlierAnswer::Conflict {
                    field: "id",
                    why: format!("order {order_id} already exists with different contents"),
                },
            });
        }
        let event_id = Uuid::parse_str(&event_id).map_err(StoreError::rejected)?;
        Ok(EarlierAnswer::Same(event_id))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::services::pedidos::domain::OrderLine;

    fn order() -> NewOrder {
        NewOrder {
            id: "P-1".into(),
            customer: "ana".into(),
            market: "girona".into(),
            lines: vec![OrderLine {
                product: "calabacin".into(),
                quantity: 1,
                price_cents: 220,
            }],
            card: None,
            address: None,
        }
    }

    #[test]
    fn a_fingerprint_changes_with_anything_the_order_says() {
        let base = fingerprint(&order());
        assert_eq!(base, fingerprint(&order()));
        assert_eq!(base.len(), 64);
        let mut other = order();
        other.lines[0].quantity = 2;
        assert_ne!(base, fingerprint(&other));
        let mut other = order();
        other.card = Some("tok_visa".into());
        assert_ne!(base, fingerprint(&other));
    }

    #[test]
    fn keys_are_visible_ascii_of_bounded_length() {
        assert!(valid_key("a1b2-c3"));
        assert!(!valid_key(""));
        assert!(!valid_key("with space"));
        assert!(!valid_key("bell\u{7}"));
        assert!(!valid_key(&"k".repeat(MAX_KEY_LEN + 1)));
    }
}
