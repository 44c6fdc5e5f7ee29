//! The external maps service reparto asks for each delivery's route, and how its failures
//! are classified: "come back later" (5xx, 429, timeouts, refused connections) is
//! transient, any other refusal permanent.

use std::time::Duration;

use async_trait::async_trait;

/// Longest wait for the maps service.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why the route could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapsError {
    /// The service is down, overloaded or slow: try again later.
    #[error("maps service unavailable: {0}")]
    Unavailable(String),
    /// The service refused this address; asking again will not help.
    #[error("maps service refused the address: {0}")]
    Refused(String),
}

impl MapsError {
    /// Whether asking again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    /// The error a handler returns for it: retried if transient, dead-lettered otherwise.
    pub fn into_handler_error(self) -> entrega::HandlerError {
        if self.is_transient() {
            entrega::HandlerError::transient(self)
        } else {
            entrega::HandlerError::permanent(self)
        }
    }
}

/// Route lengths for deliveries.
#[async_trait]
pub trait Maps: Send + Sync {
    /// Kilometres from the city's depot to `street`.
    async fn route_km(&self, city: &str, street: &str) -> Result<f64, MapsError>;
}

/// A maps service over HTTP: `GET <base>/ruta?ciudad=..&calle=..` answering `{"km": 3.2}`.
#[derive(Debug, Clone)]
pub struct HttpMaps {
    client: reqwest::Client,
    base: String,
}

impl HttpMaps {
    /// A client of the service at `base` (e.g. `http://127.0.0.1:8090`).
    pub fn new(base: &str) -> Result<Self, MapsError> {
        Self::with_builder(base, reqwest::Client::builder())
    }

    /// A client of the service at `base` built from `builder` (e.g. one that trusts a
    /// private certificate authority for `https://`), with the maps timeout.
    pub fn with_builder(base: &str, builder: reqwest::ClientBuilder) -> Result<Self, MapsError> {
        let client = builder
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| MapsError::Refused(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
        })
    }
}

#[derive(serde::Deserialize)]
struct Route {
    km: f64,
}

#[async_trait]
impl Maps for HttpMaps {
    async fn route_km(&self, city: &str, street: &str) -> Result<f64, MapsError> {
        let request = self.client.get(format!("{}/ruta", self.base));
        let response = crate::telemetry::http::outgoing(request)
            .query(&[("ciudad", city), ("calle", street)])
            .send()
            .await
            // Connection refused, reset or timed out: the service may be back soon.
            .map_err(|e| MapsError::Unavailable(e.to_string()))?;
        let status = response.status();
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(MapsError::Unavailable(format!("HTTP {status}")));
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(MapsError::Refused(format!("HTTP {status}: {body}")));
        }
        let route: Route = response
            .json()
            .await
            .map_err(|e| MapsError::Refused(format!("unreadable answer: {e}")))?;
        if route.km.is_finite() && route.km >= 0.0 {
            Ok(route.km)
        } else {
            Err(MapsError::Refused(format!("route of {} km", route.km)))
        }
    }
}

/// Routes computed in-process (a stable figure from the address), for running km0 without
/// a maps service.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalMaps;

#[async_trait]
impl Maps for LocalMaps {
    async fn route_km(&self, city: &str, street: &str) -> Result<f64, MapsError> {
        let sum = city.bytes().chain(street.bytes()).fold(0u32, |acc, b| {
            acc.wrapping_mul(31).wrapping_add(u32::from(b))
        });
        Ok(1.0 + f64::from(sum % 140) / 10.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_routes_are_stable_and_short() {
        let a = LocalMaps
            .route_km("Tarragona", "Rambla Nova 1")
            .await
            .unwrap();
        let b = LocalMaps
            .route_km("Tarragona", "Rambla Nova 1")
            .await
            .unwrap();
        assert_eq!(a, b);
        assert!((1.0..=15.0).contains(&a));
    }

    #[tokio::test]
    async fn an_unreachable_service_is_transient() {
        // Nothing listens on port 9 of loopback.
        let maps = HttpMaps::new("http://127.0.0.1:9").unwrap();
        let err = maps.route_km("Madrid", "Sol 1").await.unwrap_err();
        assert!(err.is_transient(), "{err}");
    }
}
