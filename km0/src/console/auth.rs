//! Who may do what in the console: reads are open to loopback clients, everything else needs
//! an operator token. Tokens are configured as `name:secret` (`--console-token`, repeatable,
//! or `KM0_CONSOLE_TOKENS` separated by commas); the name is the operator the audit records.
//! A token is sent as `Authorization: Bearer <secret>` (the console's script does this) or,
//! for page reads from elsewhere, in the `km0_token` cookie.

use std::net::SocketAddr;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// A configured token is not `name:secret` with both parts present.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("console token must be `name:secret` with a name and a secret of at least 12 characters")]
pub struct BadToken;

/// The operators allowed to act, each with its secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Operators(Vec<(String, String)>);

impl std::fmt::Debug for Operators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_tuple("Operators").field(&names).finish()
    }
}

impl Operators {
    /// Parses `name:secret` entries.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, BadToken> {
        let mut operators = Vec::new();
        for entry in entries {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let (name, secret) = entry.split_once(':').ok_or(BadToken)?;
            let (name, secret) = (name.trim(), secret.trim());
            if name.is_empty() || secret.chars().count() < 12 {
                return Err(BadToken);
            }
            operators.push((name.to_owned(), secret.to_owned()));
        }
        Ok(Self(operators))
    }

    /// Whether any token is configured (without one, no action is possible).
    pub fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// The operator whose secret `headers` carry, if one does.
    pub fn identify(&self, headers: &HeaderMap) -> Option<&str> {
        let given = bearer(headers).or_else(|| cookie(headers))?;
        self.0
            .iter()
            .find(|(_, secret)| same(secret.as_bytes(), given.as_bytes()))
            .map(|(name, _)| name.as_str())
    }

    /// The operator allowed to act, or the answer refusing the action.
    pub fn require(&self, headers: &HeaderMap) -> Result<String, Refusal> {
        if !self.any() {
            return Err(refused(
                StatusCode::FORBIDDEN,
                "no operator token is configured (--console-token name:secret): actions are off",
            ));
        }
        match self.identify(headers) {
            Some(name) => Ok(name.to_owned()),
            None if bearer(headers).is_some() || cookie(headers).is_some() => Err(refused(
                StatusCode::UNAUTHORIZED,
                "the operator token is not valid",
            )),
            None => Err(refused(
                StatusCode::UNAUTHORIZED,
                "this action needs an operator token",
            )),
        }
    }

    /// Whether a client at `peer` may read pages: loopback clients always, others with a
    /// valid token.
    pub fn may_read(&self, peer: SocketAddr, headers: &HeaderMap) -> bool {
        peer.ip().is_loopback() || self.identify(headers).is_some()
    }
}

/// A request refused, answered as the console's script reads it: `{"error": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// Why, for the operator.
    pub reason: String,
}

/// A refusal's body.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RefusalBody {
    /// Why, for the operator.
    pub error: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = RefusalBody { error: self.reason };
        (self.status, Json(body)).into_response()
    }
}

/// A [`Refusal`] with `status` and `reason`.
pub fn refused(status: StatusCode, reason: &str) -> Refusal {
    Refusal {
        status,
        reason: reason.to_owned(),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix("km0_token="))
        .find(|t| !t.is_empty())
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use axum::http::HeaderValue;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn a_token_names_its_operator() {
        let ops = Operators::parse(["ana:un-secreto-largo", "joan:otro-secreto-largo"]).unwrap();
        let h = with(header::AUTHORIZATION, "Bearer otro-secreto-largo");
        assert_eq!(ops.identify(&h), Some("joan"));
        let c = with(header::COOKIE, "a=b; km0_token=un-secreto-largo");
        assert_eq!(ops.identify(&c), Some("ana"));
        assert_eq!(ops.require(&h).unwrap(), "joan");
    }

    #[test]
    fn a_missing_or_wrong_token_is_refused() {
        let ops = Operators::parse(["ana:un-secreto-largo"]).unwrap();
        let none = ops.require(&HeaderMap::new()).unwrap_err();
        assert_eq!(none.status, StatusCode::UNAUTHORIZED);
        let wrong = with(header::AUTHORIZATION, "Bearer un-secreto-larg0");
        assert_eq!(
            ops.require(&wrong).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        let off = Operators::default().require(&wrong).unwrap_err();
        assert_eq!(off.status, StatusCode::FORBIDDEN);
    }

    #[test]
    fn reads_need_a_token_off_loopback() {
        let ops = Operators::parse(["ana:un-secreto-largo"]).unwrap();
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let remote: SocketAddr = "10.0.0.7:5000".parse().unwrap();
        assert!(ops.may_read(local, &HeaderMap::new()));
        assert!(!ops.may_read(remote, &HeaderMap::new()));
        let c = with(header::COOKIE, "km0_token=un-secreto-largo");
        assert!(ops.may_read(remote, &c));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in ["ana", ":un-secreto-largo", "ana:corto"] {
            assert_eq!(Operators::parse([bad]).unwrap_err(), BadToken, "{bad}");
        }
        assert!(!Operators::parse(["", " "]).unwrap().any());
    }
}
