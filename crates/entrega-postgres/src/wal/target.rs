//! The replication connection's settings, read from the same database URL the pools use.

use std::path::PathBuf;
use std::time::Duration;

use entrega_core::StoreError;
use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};

/// Session settings of the replication connection: timestamps come out in ISO form and UTC,
/// the form [`super::OutboxColumns`] reads.
const SESSION: &str = "-c datestyle=ISO -c timezone=UTC";

/// [`replication_config`] for the server `url` names that takes writes now: on a URL naming
/// several servers, after a failover, the promoted standby ([`crate::current_server_url`]).
pub async fn current_replication_config(
    url: &str,
    slot: &str,
    publication: &str,
    status_interval: Duration,
) -> Result<ReplicationConfig, StoreError> {
    let server = crate::current_server_url(url).await?;
    replication_config(&server, slot, publication, status_interval)
}

/// The replication session for `slot` and `publication` on the database of `url`
/// (`postgres://user:password@host:port/db?sslmode=...&sslrootcert=...`), with the user,
/// password, host, port, database and TLS settings the URL gives (`sslmode` as libpq reads
/// it, `prefer` by default; `sslrootcert`, `sslcert`, `sslkey`). The walsender is told the
/// position every `status_interval`.
pub fn replication_config(
    url: &str,
    slot: &str,
    publication: &str,
    status_interval: Duration,
) -> Result<ReplicationConfig, StoreError> {
    let bad = |why: String| StoreError::rejected(format!("{why} in the database URL"));
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(bad(format!("scheme `{}` is not postgres", parsed.scheme())));
    }
    let decode = |s: &str| {
        percent_decode(s).ok_or_else(|| bad("a percent-encoded part is not UTF-8".into()))
    };
    let mut host = decode(parsed.host_str().unwrap_or("localhost"))?;
    let user = match parsed.username() {
        "" => "postgres".to_owned(),
        name => decode(name)?,
    };
    let password = decode(parsed.password().unwrap_or(""))?;
    let database = match parsed.path().trim_start_matches('/') {
        "" => user.clone(),
        name => decode(name)?,
    };
    let mut tls = TlsConfig::disabled();
    tls.mode = SslMode::Prefer;
    let mut port = parsed.port().unwrap_or(5432);
    for (name, value) in parsed.query_pairs() {
        match name.as_ref() {
            "sslmode" => {
                tls.mode = match value.as_ref() {
                    "disable" | "allow" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => return Err(bad(format!("sslmode `{other}` is unknown"))),
                }
            }
            "sslrootcert" => tls.ca_pem_path = Some(PathBuf::from(value.as_ref())),
            "sslcert" => tls.client_cert_pem_path = Some(PathBuf::from(value.as_ref())),
            "sslkey" => tls.client_key_pem_path = Some(PathBuf::from(value.as_ref())),
            "host" => host = value.into_owned(),
            "port" => {
                port = value
                    .parse()
                    .map_err(|_| bad(format!("port `{value}` is not a number")))?
            }
            _ => {}
        }
    }
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(port)
            .with_tls(tls)
            .with_options(SESSION)
            .with_status_interval(status_interval)
            .with_wakeup_interval(status_interval)
            .with_application_name(format!("entrega wal relay {slot}")),
    )
}

/// `%XX` sequences decoded; `None` when the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_pools_url_gives_the_replication_session() {
        let c = replication_config(
            "postgres://km0%40x:p%2Fw@127.0.0.1:5433/km0_pedidos?sslmode=verify-full&sslrootcert=/ca.pem",
            "s",
            "p",
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("km0@x", "p/w"));
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 5433));
        assert_eq!(c.database, "km0_pedidos");
        assert_eq!(c.tls.mode, SslMode::VerifyFull);
        assert_eq!(c.tls.ca_pem_path, Some(PathBuf::from("/ca.pem")));
        let plain =
            replication_config("postgres://postgres@h/db", "s", "p", Duration::from_secs(1))
                .unwrap();
        assert_eq!((plain.port, plain.tls.mode), (5432, SslMode::Prefer));
        assert!(replication_config("mysql://h/db", "s", "p", Duration::from_secs(1)).is_err());
        assert!(replication_config(
            "postgres://h/db?sslmode=maybe",
            "s",
            "p",
            Duration::from_secs(1)
        )
        .is_err());
    }
}
