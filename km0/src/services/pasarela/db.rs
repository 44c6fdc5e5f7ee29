//! The gateway's ledger: every idempotency key with the request it was first used for and
//! the answer it got, and every charge. It proves how many times each order was charged.
//!
//! A key is taken in one transaction before anything is charged (`en_curso`, with a lease so
//! a request that died with it does not block its key for ever), and completed in the same
//! transaction as the charge it led to (`completada`, with the stored answer).

use entrega::db::{query, Db, Migration};
use entrega_core::StoreError;

/// Keys and charges.
const MIGRATIONS: &[Migration] = &[
    Migration::same(
        1,
        "claves_idempotencia and cargos",
        "CREATE TABLE IF NOT EXISTS claves_idempotencia (
        clave TEXT PRIMARY KEY, huella TEXT NOT NULL, estado TEXT NOT NULL,
        codigo INTEGER, respuesta TEXT, bloqueada_hasta_ms BIGINT NOT NULL,
        creado_ms BIGINT NOT NULL);
    CREATE TABLE IF NOT EXISTS cargos (
        id TEXT PRIMARY KEY, clave TEXT NOT NULL, referencia TEXT NOT NULL,
        tarjeta TEXT NOT NULL, importe_centimos BIGINT NOT NULL, resultado TEXT NOT NULL,
        motivo TEXT, creado_ms BIGINT NOT NULL);
    CREATE INDEX IF NOT EXISTS cargos_referencia ON cargos (referencia);",
    ),
    Migration::same(
        2,
        "reembolsos: at most one per charge",
        "CREATE TABLE IF NOT EXISTS reembolsos (
            id TEXT PRIMARY KEY, clave TEXT NOT NULL, cargo TEXT NOT NULL UNIQUE,
            referencia TEXT NOT NULL, importe_centimos BIGINT NOT NULL,
            creado_ms BIGINT NOT NULL);
        CREATE INDEX IF NOT EXISTS reembolsos_referencia ON reembolsos (referencia);",
    ),
];

/// A key as stored: fingerprint, state, answer status and body, lease end.
type KeyRow = (String, String, Option<i32>, Option<String>, i64);

/// What taking a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The key is this request's now: go on and charge.
    Fresh,
    /// The key was completed before, for the same request: answer with what it answered.
    Replay {
        /// The stored status code.
        status: u16,
        /// The stored body.
        body: String,
    },
    /// The key is held by a request still running (409).
    InProgress,
    /// The key was used for another request (422).
    Mismatch,
}

/// One charge of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Charge {
    /// Charge id (`ch_...`).
    pub id: String,
    /// The idempotency key it was made under.
    #[serde(rename = "clave")]
    pub key: String,
    /// The merchant's reference (the order id).
    #[serde(rename = "referencia")]
    pub reference: String,
    /// Amount in cents.
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
    /// `aprobado` or `rechazado`.
    #[serde(rename = "resultado")]
    pub outcome: String,
    /// Why it was declined.
    #[serde(rename = "motivo")]
    pub reason: Option<String>,
}

/// One refund of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Refund {
    /// Refund id (`re_...`).
    pub id: String,
    /// The idempotency key it was made under.
    #[serde(rename = "clave")]
    pub key: String,
    /// The charge it gives back.
    #[serde(rename = "cargo")]
    pub charge: String,
    /// The merchant's reference.
    #[serde(rename = "referencia")]
    pub reference: String,
    /// Amount in cents.
    #[serde(rename = "importe_centimos")]
    pub amount_cents: i64,
}

/// What one reference was charged and given back, summed over the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReferenceTotals {
    /// Approved charges.
    pub charges: u64,
    /// Their amount in cents.
    pub charged_cents: i64,
    /// Refunds.
    pub refunds: u64,
    /// Their amount in cents.
    pub refunded_cents: i64,
}

impl ReferenceTotals {
    /// Charged net of refunds, in cents.
    pub fn net_cents(&self) -> i64 {
        self.charged_cents - self.refunded_cents
    }
}

/// What was charged under a charge's idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeLookup {
    /// A request with that key is still running.
    InProgress,
    /// Charged, by this charge.
    Approved(Charge),
    /// Nothing: the key was never used, the charge was declined, or it failed first.
    Nothing,
}

/// The ledger database.
#[derive(Debug, Clone)]
pub struct Ledger {
    db: Db,
}

impl Ledger {
    /// The ledger in `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates the tables if missing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db.apply_migrations("pasarela", MIGRATIONS).await
    }

    /// Takes `key` for the request with `fingerprint`, leased until `now_ms + lease_ms`.
    pub async fn take(
        &self,
        key: &str,
        fingerprint: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Taken, StoreError> {
        let mut tx = self.db.begin().await?;
        let inserted = tx
            .execute(
                query(
                    "INSERT INTO claves_idempotencia \
                     (clave, huella, estado, bloqueada_hasta_ms, creado_ms) \
                     VALUES ($1, $2, 'en_curso', $3, $4) ON CONFLICT (clave) DO NOTHING",
                )
                .bind(key)
                .bind(fingerprint)
                .bind(now_ms + lease_ms)
                .bind(now_ms),
            )
            .await?;
        if inserted == 1 {
            tx.commit().await?;
            return Ok(Taken::Fresh);
        }
        let row: Option<KeyRow> = tx
            .fetch_optional(
                query(
                    "SELECT huella, estado, codigo, respuesta, bloqueada_hasta_ms \
                     FROM claves_idempotencia WHERE clave = $1",
                )
                .bind(key),
            )
            .await?;
        let Some((stored, state, status, body, until)) = row else {
            // Released between the insert and the read: the caller may try again.
            tx.rollback().await?;
            return Ok(Taken::InProgress);
        };
        let taken = if stored != fingerprint {
            Taken::Mismatch
        } else if state == "completada" {
            Taken::Replay {
                status: status.and_then(|s| u16::try_from(s).ok()).unwrap_or(500),
                body: body.unwrap_or_default(),
            }
        } else if until > now_ms {
            Taken::InProgress
        } else {
            // The request holding it died: this one takes it over.
            let moved = tx
                .execute(
                    query(
                        "UPDATE claves_idempotencia SET bloqueada_hasta_ms = $1 \
                         WHERE clave = $2 AND estado = 'en_curso' AND bloqueada_hasta_ms = $3",
                    )
                    .bind(now_ms + lease_ms)
                    .bind(key)
                    .bind(until),
                )
                .await?;
            if moved == 1 {
                Taken::Fresh
            } else {
                Taken::InProgress
            }
        };
        tx.commit().await?;
        Ok(taken)
    }

    /// Gives `key` back without an answer (nothing was charged): a retry starts over.
    pub async fn release(&self, key: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                query("DELETE FROM claves_idempotencia WHERE clave = $1 AND estado = 'en_curso'")
                    .bind(key),
            )
            .await
            .map(drop)
    }

    /// Records `charge` (if any) and completes `key` with the answer, in one transaction.
    pub async fn complete(
        &self,
        key: &str,
        charge: Option<&Charge>,
        card: &str,
        status: u16,
        body: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await?;
        if let Some(c) = charge {
            tx.execute(
                query(
                    "INSERT INTO cargos (id, clave, referencia, tarjeta, importe_centimos, \
                     resultado, motivo, creado_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(c.id.clone())
                .bind(key)
                .bind(c.reference.clone())
                .bind(card)
                .bind(c.amount_cents)
                .bind(c.outcome.clone())
                .bind(c.reason.clone())
                .bind(now_ms),
            )
            .await?;
        }
        tx.execute(
            query(
                "UPDATE claves_idempotencia SET estado = 'completada', codigo = $1, \
                 respuesta = $2 WHERE clave = $3",
            )
            .bind(i32::from(status))
            .bind(body)
            .bind(key),
        )
        .await?;
        tx.commit().await
    }

    /// What was charged under the charge key `key`.
    pub async fn charge_under(&self, key: &str) -> Result<ChargeLookup, StoreError> {
        let state: Option<String> = self
            .db
            .scalar(query("SELECT estado FROM claves_idempotencia WHERE clave = $1").bind(key))
            .await?;
        if state.as_deref() == Some("en_curso") {
            return Ok(ChargeLookup::InProgress);
        }
        let row: Option<(String, String, String, i64, String, Option<String>)> = self
            .db
            .fetch_optional(
                query(
                    "SELECT id, clave, referencia, importe_centimos, resultado, motivo \
                     FROM cargos WHERE clave = $1 AND resultado = 'aprobado'",
                )
                .bind(key),
            )
            .await?;
        Ok(match row {
            Some((id, key, reference, amount_cents, outcome, reason)) => {
                ChargeLookup::Approved(Charge {
                    id,
                    key,
                    reference,
                    amount_cents,
                    outcome,
                    reason,
                })
            }
            None => ChargeLookup::Nothing,
        })
    }

    /// Records `refund` (if any) and completes `key` with the answer, in one transaction;
    /// returns the answer stored. A charge refunded before under another key is not
    /// refunded again: the answer is that earlier refund's.
    pub async fn complete_refund(
        &self,
        key: &str,
        refund: Option<&Refund>,
        status: u16,
        body: &str,
        now_ms: i64,
    ) -> Result<String, StoreError> {
        let mut tx = self.db.begin().await?;
        let mut body = body.to_owned();
        if let Some(r) = refund {
            let inserted = tx
                .execute(
                    query(
                        "INSERT INTO reembolsos (id, clave, cargo, referencia, importe_centimos, \
                         creado_ms) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (cargo) DO NOTHING",
                    )
                    .bind(r.id.as_str())
                    .bind(key)
                    .bind(r.charge.as_str())
                    .bind(r.reference.as_str())
                    .bind(r.amount_cents)
                    .bind(now_ms),
                )
                .await?;
            if inserted == 0 {
                let earlier: Option<String> = tx
                    .scalar(
                        query("SELECT id FROM reembolsos WHERE cargo = $1").bind(r.charge.as_str()),
                    )
                    .await?;
                let answer = super::api::RefundAnswer {
                    id: earlier,
                    estado: super::api::RefundState::Refunded,
                    cargo: Some(r.charge.clone()),
                    importe_centimos: Some(r.amount_cents),
                    referencia: r.reference.clone(),
                };
                body = serde_json::to_string(&answer).unwrap_or_default();
            }
        }
        tx.execute(
            query(
                "UPDATE claves_idempotencia SET estado = 'completada', codigo = $1, \
                 respuesta = $2 WHERE clave = $3",
            )
            .bind(i32::from(status))
            .bind(body.as_str())
            .bind(key),
        )
        .await?;
        tx.commit().await?;
        Ok(body)
    }

    /// Every refund made for `reference`, oldest first.
    pub async fn refunds_for(&self, reference: &str) -> Result<Vec<Refund>, StoreError> {
        let rows: Vec<(String, String, String, String, i64)> = self
            .db
            .fetch_all(
                query(
                    "SELECT id, clave, cargo, referencia, importe_centimos FROM reembolsos \
                     WHERE referencia = $1 ORDER BY creado_ms, id",
                )
                .bind(reference),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, key, charge, reference, amount_cents)| Refund {
                id,
                key,
                charge,
                reference,
                amount_cents,
            })
            .collect())
    }

    /// What `reference` was charged, net of refunds, in cents.
    pub async fn net_for(&self, reference: &str) -> Result<i64, StoreError> {
        let charged: Option<i64> = self
            .db
            .scalar(
                query(
                    "SELECT CAST(COALESCE(SUM(importe_centimos), 0) AS BIGINT) FROM cargos \
                     WHERE referencia = $1 AND resultado = 'aprobado'",
                )
                .bind(reference),
            )
            .await?;
        let refunded: Option<i64> = self
            .db
            .scalar(
                query(
                    "SELECT CAST(COALESCE(SUM(importe_centimos), 0) AS BIGINT) FROM reembolsos \
                     WHERE referencia = $1",
                )
                .bind(reference),
            )
            .await?;
        Ok(charged.unwrap_or(0) - refunded.unwrap_or(0))
    }

    /// Approved charges and refunds of every reference that has any, by reference: two
    /// grouped reads of the whole ledger.
    pub async fn totals(
        &self,
    ) -> Result<std::collections::BTreeMap<String, ReferenceTotals>, StoreError> {
        let charged: Vec<(String, i64, i64)> = self
            .db
            .fetch_all(query(
                "SELECT referencia, CAST(COUNT(*) AS BIGINT), \
                        CAST(SUM(importe_centimos) AS BIGINT) \
                 FROM cargos WHERE resultado = 'aprobado' GROUP BY referencia",
            ))
            .await?;
        let refunded: Vec<(String, i64, i64)> = self
            .db
            .fetch_all(query(
                "SELECT referencia, CAST(COUNT(*) AS BIGINT), \
                        CAST(SUM(importe_centimos) AS BIGINT) \
                 FROM reembolsos GROUP BY referencia",
            ))
            .await?;
        let mut totals = std::collections::BTreeMap::<String, ReferenceTotals>::new();
        for (reference, count, cents) in charged {
            let t = totals.entry(reference).or_default();
            t.charges = u64::try_from(count).unwrap_or(0);
            t.charged_cents = cents;
        }
        for (reference, count, cents) in refunded {
            let t = totals.entry(reference).or_default();
            t.refunds = u64::try_from(count).unwrap_or(0);
            t.refunded_cents = cents;
        }
        Ok(totals)
    }

    /// Every charge made for `reference`, oldest first.
    pub async fn charges_for(&self, reference: &str) -> Result<Vec<Charge>, StoreError> {
        let rows: Vec<(String, String, String, i64, String, Option<String>)> = self
            .db
            .fetch_all(
                query(
                    "SELECT id, clave, referencia, importe_centimos, resultado, motivo \
                     FROM cargos WHERE referencia = $1 ORDER BY creado_ms, id",
                )
                .bind(reference),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, key, reference, amount_cents, outcome, reason)| Charge {
                    id,
                    key,
                    reference,
                    amount_cents,
                    outcome,
                    reason,
                },
            )
            .collect())
    }
}
