//! km0's contracts in a schema registry speaking the Confluent Schema Registry API (Confluent's
//! own, or Apicurio Registry's `/apis/ccompat/v7`): one subject per `tipo` and version
//! (`<prefix><tipo>-v<version>`), its compatibility level the channel's policy, each schema
//! registered as JSON Schema. The registry then refuses (HTTP 409) a new schema that breaks
//! the policy, and answers whether a candidate is compatible with what it holds.
//!
//! Registries that speak this API read JSON Schema up to draft-07 (Apicurio 3.3 answers 500
//! for a draft 2020-12 schema), so schemas are sent declaring draft-07: km0's schemas use
//! nothing draft-07 lacks (`$defs` references included).

use std::time::Duration;

use entrega::Catalog;
use serde::Serialize;
use serde_json::{json, Value};

/// The draft the registry is told each schema is written in.
const DRAFT_07: &str = "http://json-schema.org/draft-07/schema#";
/// Longest wait for one answer of the registry.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Tries of one call when the connection fails or the registry answers 502, 503 or 504.
/// Every call of this API is idempotent (registering a schema already there returns its id),
/// so a call whose answer was lost may be sent again.
const ATTEMPTS: u32 = 3;
/// Wait before the second try; doubled before each later one.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// Why talking to the registry failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The registry could not be reached or answered something unreadable.
    #[error("schema registry at {url}: {reason}")]
    Unavailable {
        /// The URL asked.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The registry refused the schema as incompatible with the subject's level.
    #[error(
        "schema registry refused `{subject}` as {level}-incompatible with what it holds: {detail}"
    )]
    Incompatible {
        /// The subject.
        subject: String,
        /// The subject's compatibility level.
        level: String,
        /// What the registry said.
        detail: String,
    },
}

/// What registering one contract did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Registered {
    /// The subject.
    pub subject: String,
    /// The registry's id of the schema.
    pub id: i64,
    /// The subject's compatibility level.
    pub level: String,
    /// Whether this schema was new to the subject (else it was there already).
    pub new: bool,
}

/// A schema registry with the Confluent API at `base` (e.g.
/// `http://127.0.0.1:8081/apis/ccompat/v7`).
#[derive(Debug, Clone)]
pub struct SchemaRegistry {
    http: reqwest::Client,
    base: String,
    prefix: String,
}

impl SchemaRegistry {
    /// The registry at `base`.
    pub fn new(base: &str) -> Result<Self, RegistryError> {
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| RegistryError::Unavailable {
                url: base.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            prefix: String::new(),
        })
    }

    /// Names every subject with `prefix` first (one registry shared by several deployments).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The subject of `tipo` at `version`.
    pub fn subject(&self, tipo: &str, version: u32) -> String {
        format!("{}{tipo}-v{version}", self.prefix)
    }

    /// Registers every contract of `catalog`: the subject's level set to its channel's policy,
    /// then its current schema. A schema already there keeps its id; one that breaks the level
    /// is refused, and nothing after it is registered.
    pub async fn register(&self, catalog: &Catalog) -> Result<Vec<Registered>, RegistryError> {
        let mut done = Vec::new();
        for contract in catalog.contracts() {
            let subject = self.subject(&contract.tipo, contract.version);
            let level = catalog.policy_of(&contract.channel).to_string();
            self.call(
                reqwest::Method::PUT,
                &format!("config/{subject}"),
                &json!({ "compatibility": level }),
            )
            .await?;
            let body = schema_body(&contract.schema);
            let known = self
                .call_allowing(
                    reqwest::Method::POST,
                    &format!("subjects/{subject}"),
                    &body,
                    404,
                )
                .await?;
            let (id, new) = match known.as_ref().and_then(|k| k["id"].as_i64()) {
                Some(id) => (id, false),
                None => {
                    let answer = self
                        .call_allowing(
                            reqwest::Method::POST,
                            &format!("subjects/{subject}/versions"),
                            &body,
                            409,
                        )
                        .await?;
                    let Some(answer) = answer else {
                        return Err(RegistryError::Incompatible {
                            subject,
                            level,
                            detail: "HTTP 409".to_owned(),
                        });
                    };
                    let id = answer["id"]
                        .as_i64()
                        .ok_or_else(|| self.unreadable(&answer))?;
                    (id, true)
                }
            };
            done.push(Registered {
                subject,
                id,
                level,
                new,
            });
        }
        Ok(done)
    }

    /// Whether `schema` could be registered as the next schema of `tipo` at `version` under
    /// the subject's level; `true` for a subject the registry does not hold yet.
    pub async fn compatible(
        &self,
        tipo: &str,
        version: u32,
        schema: &Value,
    ) -> Result<bool, RegistryError> {
        let subject = self.subject(tipo, version);
        let answer = self
            .call_allowing(
                reqwest::Method::POST,
                &format!("compatibility/subjects/{subject}/versions/latest"),
                &schema_body(schema),
                404,
            )
            .await?;
        match answer {
            None => Ok(true),
            Some(answer) => answer["is_compatible"]
                .as_bool()
                .ok_or_else(|| self.unreadable(&answer)),
        }
    }

    /// The subjects the registry holds.
    pub async fn subjects(&self) -> Result<Vec<String>, RegistryError> {
        let answer = self
            .call(reqwest::Method::GET, "subjects", &Value::Null)
            .await?;
        serde_json::from_value(answer.clone()).map_err(|_| self.unreadable(&answer))
    }

    /// The versions the registry holds of `subject`.
    pub async fn versions(&self, subject: &str) -> Result<Vec<i64>, RegistryError> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("subjects/{subject}/versions"),
                &Value::Null,
            )
            .await?;
        serde_json::from_value(answer.clone()).map_err(|_| self.unreadable(&answer))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> Result<Value, RegistryError> {
        self.call_allowing(method, path, body, 0)
            .await?
            .ok_or_else(|| self.unavailable(path, "no answer".to_owned()))
    }

    /// Calls `path`; `None` when the registry answers `allowed` (404: unknown, 409:
    /// incompatible), an error on any other failure. A failed connection, an answer cut off
    /// and a 502, 503 or 504 are tried again, up to [`ATTEMPTS`] in all.
    async fn call_allowing(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
        allowed: u16,
    ) -> Result<Option<Value>, RegistryError> {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match self.send(method.clone(), path, body).await {
                Err(failure) if failure.transient && attempt < ATTEMPTS => {
                    tracing::warn!(
                        path,
                        attempt,
                        reason = %failure.reason,
                        "schema registry call failed; trying again"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                Err(failure) => return Err(self.unavailable(path, failure.reason)),
                Ok((status, _)) if status == allowed => return Ok(None),
                Ok((status, text)) if !(200..300).contains(&status) => {
                    return Err(self.unavailable(path, format!("HTTP {status}: {text}")))
                }
                Ok((_, text)) => {
                    return serde_json::from_str(&text).map(Some).map_err(|e| {
                        self.unavailable(path, format!("unreadable answer: {e}: {text}"))
                    })
                }
            }
        }
    }

    /// One request: the status and body of the answer, or why there was none (a 502, 503 or
    /// 504 counts as none, and may be tried again).
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> Result<(u16, String), SendFailure> {
        let url = format!("{}/{path}", self.base);
        let mut request = self
            .http
            .request(method, &url)
            .header("Content-Type", "application/vnd.schemaregistry.v1+json");
        if !body.is_null() {
            request = request.body(body.to_string());
        }
        let response = request.send().await.map_err(SendFailure::from)?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(SendFailure::from)?;
        if matches!(status, 502..=504) {
            return Err(SendFailure {
                transient: true,
                reason: format!("HTTP {status}: {text}"),
            });
        }
        Ok((status, text))
    }

    fn unavailable(&self, path: &str, reason: String) -> RegistryError {
        RegistryError::Unavailable {
            url: format!("{}/{path}", self.base),
            reason,
        }
    }

    fn unreadable(&self, answer: &Value) -> RegistryError {
        RegistryError::Unavailable {
            url: self.base.clone(),
            reason: format!("unexpected answer: {answer}"),
        }
    }
}

/// Why one request got no answer.
struct SendFailure {
    /// Whether trying again may succeed: the connection failed or the answer was cut off,
    /// not a timeout (waited out already) or a request that could not be built.
    transient: bool,
    reason: String,
}

impl From<reqwest::Error> for SendFailure {
    fn from(e: reqwest::Error) -> Self {
        Self {
            transient: !e.is_timeout() && (e.is_connect() || e.is_request() || e.is_body()),
            reason: e.to_string(),
        }
    }
}

/// A registration body: the schema as JSON Schema text, declared draft-07.
fn schema_body(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(map) = schema.as_object_mut() {
        map.insert("$schema".to_owned(), Value::String(DRAFT_07.to_owned()));
    }
    json!({ "schemaType": "JSON", "schema": schema.to_string() })
}

#[cfg(test)]
mod tests;
