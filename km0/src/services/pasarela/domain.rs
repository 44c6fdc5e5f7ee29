//! The payment gateway's rules: what a charge request is, when it is declined, and the faults
//! a run injects.

use serde::{Deserialize, Serialize};

use super::api::{ChargeBody, RefundBody};

/// A charge request, `{"tarjeta", "importe_centimos", "referencia"}`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    /// Card token (`tarjeta`).
    pub card: String,
    /// Amount in cents (`importe_centimos`), at least 1.
    pub amount_cents: i64,
    /// The merchant's reference (`referencia`): km0 sends the order id.
    pub reference: String,
}

/// Why a body is not a charge request; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidCharge {
    /// The field at fault.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ChargeRequest {
    /// Reads a JSON body: its members, then their values, naming the one at fault.
    pub fn from_json(body: &[u8]) -> Result<Self, InvalidCharge> {
        let body: ChargeBody =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
                .map_err(|e| InvalidCharge {
                    field: member(e.path().to_string()),
                    message: e.into_inner().to_string(),
                })?;
        Ok(Self {
            card: text(body.tarjeta, "tarjeta", 200)?,
            amount_cents: if body.importe_centimos >= 1 {
                body.importe_centimos
            } else {
                return Err(InvalidCharge {
                    field: "importe_centimos".to_owned(),
                    message: "must be an integer of at least 1".into(),
                });
            },
            reference: text(body.referencia, "referencia", 200)?,
        })
    }

    /// The request as the gateway's API writes it.
    pub fn body(&self) -> ChargeBody {
        ChargeBody {
            importe_centimos: self.amount_cents,
            referencia: self.reference.clone(),
            tarjeta: self.card.clone(),
        }
    }

    /// The request as canonical JSON (fixed member order): two requests are the same request
    /// when their fingerprints are equal.
    pub fn fingerprint(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_default()
    }
}

/// The member serde failed on, `cuerpo` for the body itself.
fn member(path: String) -> String {
    if path == "." {
        "cuerpo".to_owned()
    } else {
        path
    }
}

/// `value` when it is a text of 1 to `max` bytes.
fn text(value: String, field: &str, max: usize) -> Result<String, InvalidCharge> {
    if value.trim().is_empty() || value.len() > max {
        Err(InvalidCharge {
            field: field.to_owned(),
            message: format!("must be 1 to {max} bytes of text"),
        })
    } else {
        Ok(value)
    }
}

/// A refund request, `{"clave_cargo", "referencia"}`: the charge made under the
/// Idempotency-Key `clave_cargo`, for the merchant's `referencia`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    /// The key the charge was made under (`clave_cargo`).
    pub charge_key: String,
    /// The merchant's reference (`referencia`).
    pub reference: String,
}

impl RefundRequest {
    /// Reads a JSON body, naming the member at fault.
    pub fn from_json(body: &[u8]) -> Result<Self, InvalidCharge> {
        let body: RefundBody =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
                .map_err(|e| InvalidCharge {
                    field: member(e.path().to_string()),
                    message: e.into_inner().to_string(),
                })?;
        Ok(Self {
            charge_key: text(body.clave_cargo, "clave_cargo", 255)?,
            reference: text(body.referencia, "referencia", 255)?,
        })
    }

    /// The request as canonical JSON, for its key's fingerprint.
    pub fn fingerprint(&self) -> String {
        let body = RefundBody {
            clave_cargo: self.charge_key.clone(),
            referencia: self.reference.clone(),
        };
        serde_json::to_string(&body).unwrap_or_default()
    }
}

/// Faults injected in this run, set by flags at start and replaced through `PUT /fallos`
/// (whose JSON keeps the gateway API's names: `latencia_ms`, `fallar_503`, ...).
/// Counters (`fail_503`, `hang_after_charge`) count down as requests use them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Time each charge takes, with its key held, in milliseconds.
    #[serde(rename = "latencia_ms")]
    pub latency_ms: u64,
    /// The next this many requests answer 503 before charging anything.
    #[serde(rename = "fallar_503")]
    pub fail_503: u32,
    /// The next this many charges are recorded, then their answer waits `hang_ms`: the
    /// client times out although it was charged.
    #[serde(rename = "colgar_tras_cobro")]
    pub hang_after_charge: u32,
    /// How long such an answer waits, in milliseconds.
    #[serde(rename = "colgar_ms")]
    pub hang_ms: u64,
    /// Cards declined (`tarjeta_rechazada`).
    #[serde(rename = "tarjetas_rechazadas")]
    pub declined_cards: Vec<String>,
    /// Amounts above this are declined (`importe_excesivo`).
    #[serde(rename = "importe_maximo_centimos")]
    pub max_amount_cents: Option<i64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            fail_503: 0,
            hang_after_charge: 0,
            hang_ms: 10_000,
            declined_cards: Vec::new(),
            max_amount_cents: None,
        }
    }
}

/// What the gateway decides on a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Charged.
    Approved,
    /// Not charged, with the reason (`tarjeta_rechazada`, `importe_excesivo`).
    Declined(String),
}

impl Faults {
    /// The decision on `request` under these rules.
    pub fn decide(&self, request: &ChargeRequest) -> Decision {
        if self.declined_cards.contains(&request.card) {
            return Decision::Declined("tarjeta_rechazada".into());
        }
        if self
            .max_amount_cents
            .is_some_and(|max| request.amount_cents > max)
        {
            return Decision::Declined("importe_excesivo".into());
        }
        Decision::Approved
    }

    /// Takes one of the pending 503s, if any.
    pub fn take_503(&mut self) -> bool {
        take(&mut self.fail_503)
    }

    /// Takes one of the pending hangs after charging, if any.
    pub fn take_hang(&mut self) -> bool {
        take(&mut self.hang_after_charge)
    }
}

fn take(counter: &mut u32) -> bool {
    if *counter == 0 {
        return false;
    }
    *counter -= 1;
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_field_by_field_and_fingerprinted_canonically() {
        let read = |body: &str| ChargeRequest::from_json(body.as_bytes());
        let a = read(r#"{"referencia": "P-1", "tarjeta": "tok_visa", "importe_centimos": 1250}"#)
            .unwrap();
        let b = read(r#"{"tarjeta": "tok_visa", "importe_centimos": 1250, "referencia": "P-1"}"#)
            .unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.fingerprint(),
            r#"{"importe_centimos":1250,"referencia":"P-1","tarjeta":"tok_visa"}"#,
            "the canonical form fingerprints stored before keep matching"
        );
        let bad = read(r#"{"tarjeta": "t", "importe_centimos": 0, "referencia": "P"}"#);
        assert_eq!(bad.unwrap_err().field, "importe_centimos");
        let bad = read(r#"{"importe_centimos": 5, "referencia": "P"}"#).unwrap_err();
        assert_eq!(bad.field, "cuerpo");
        assert!(bad.message.contains("tarjeta"), "{bad}");
        let bad = read(r#"{"importe_centimos": "5", "referencia": "P", "tarjeta": "t"}"#);
        assert_eq!(bad.unwrap_err().field, "importe_centimos");
    }

    #[test]
    fn declines_by_card_and_amount_and_counters_run_down() {
        let mut f = Faults {
            declined_cards: vec!["tok_robada".into()],
            max_amount_cents: Some(10_000),
            fail_503: 1,
            ..Faults::default()
        };
        let req = |card: &str, cents| ChargeRequest {
            card: card.into(),
            amount_cents: cents,
            reference: "P".into(),
        };
        assert_eq!(f.decide(&req("tok_visa", 500)), Decision::Approved);
        assert_eq!(
            f.decide(&req("tok_robada", 500)),
            Decision::Declined("tarjeta_rechazada".into())
        );
        assert_eq!(
            f.decide(&req("tok_visa", 10_001)),
            Decision::Declined("importe_excesivo".into())
        );
        assert!(f.take_503());
        assert!(!f.take_503());
    }
}
