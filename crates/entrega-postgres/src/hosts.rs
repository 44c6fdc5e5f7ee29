//! URLs naming several servers, as libpq reads them
//! (`postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write`): the servers in
//! order, and which of them a session may use.

use std::str::FromStr;
use std::time::Duration;

use entrega_core::StoreError;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Row};

use crate::errors::{classify, invalid};

/// Which servers a session may use (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    /// Any server that answers (libpq's default with one host).
    Any,
    /// A server whose sessions may write (`transaction_read_only` off): entrega's default
    /// when the URL names several servers, as every service writes its outbox.
    ReadWrite,
    /// A server that is not in recovery (not a standby).
    Primary,
}

impl SessionAttrs {
    fn parse(value: &str) -> Result<Self, StoreError> {
        match value {
            "any" => Ok(Self::Any),
            "read-write" => Ok(Self::ReadWrite),
            "primary" => Ok(Self::Primary),
            other => Err(invalid(format!(
                "target_session_attrs `{other}` is not supported (any, read-write or primary)"
            ))),
        }
    }

    /// libpq's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::Primary => "primary",
        }
    }
}

/// One server of the URL.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `host:port` as the URL wrote it, for logs and errors.
    pub name: String,
    /// The URL with this server alone and without `target_session_attrs`.
    pub url: String,
    /// Its connect options, parsed from `url`.
    pub options: PgConnectOptions,
}

/// The servers a URL names, in its order, and the sessions wanted.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    pub hosts: Vec<Host>,
    pub attrs: SessionAttrs,
}

impl Hosts {
    /// Reads `url`. One server and no `target_session_attrs` is the plain case
    /// ([`Hosts::is_plain`]); several servers default to [`SessionAttrs::ReadWrite`].
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let not_postgres = || {
            invalid(format!(
                "not a postgres URL: `{}`",
                entrega_core::redact_url(url)
            ))
        };
        let scheme_end = url.find("://").ok_or_else(not_postgres)?;
        let (scheme, rest) = (&url[..scheme_end + 3], &url[scheme_end + 3..]);
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, servers) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (tail, ""),
        };
        let mut attrs = None;
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter(|p| match p.strip_prefix("target_session_attrs=") {
                Some(value) => {
                    attrs = Some(value.to_owned());
                    false
                }
                None => true,
            })
            .collect();
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let names: Vec<&str> = servers.split(',').collect();
        if names.iter().any(|n| n.trim().is_empty()) {
            return Err(invalid(format!(
                "an empty server in `{}`",
                entrega_core::redact_url(url)
            )));
        }
        let attrs = match attrs {
            Some(value) => SessionAttrs::parse(&value)?,
            None if names.len() > 1 => SessionAttrs::ReadWrite,
            None => SessionAttrs::Any,
        };
        let hosts = names
            .into_iter()
            .map(|name| {
                let url = format!("{scheme}{userinfo}{name}{path}{query}");
                let options = PgConnectOptions::from_str(&url).map_err(classify)?;
                Ok(Host {
                    name: name.to_owned(),
                    url,
                    options,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Self { hosts, attrs })
    }

    /// One server, any session: nothing to choose, nothing to watch.
    pub fn is_plain(&self) -> bool {
        self.hosts.len() == 1 && self.attrs == SessionAttrs::Any
    }

    /// The servers' names, comma separated.
    pub fn names(&self) -> String {
        self.hosts
            .iter()
            .map(|h| h.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The first server, in the URL's order, that answers within `timeout` and takes the
    /// sessions wanted, with a connection to it.
    pub async fn find(&self, timeout: Duration) -> Result<(usize, PgConnection), StoreError> {
        let mut reasons = Vec::new();
        for (i, host) in self.hosts.iter().enumerate() {
            match tokio::time::timeout(timeout, host.options.connect()).await {
                Ok(Ok(mut conn)) => match accepts(&mut conn, self.attrs).await {
                    Ok(true) => return Ok((i, conn)),
                    Ok(false) => {
                        reasons.push(format!("{}: not {}", host.name, self.attrs.as_str()))
                    }
                    Err(e) => reasons.push(format!("{}: {e}", host.name)),
                },
                Ok(Err(e)) => reasons.push(format!("{}: {e}", host.name)),
                Err(_) => reasons.push(format!("{}: no answer within {timeout:?}", host.name)),
            }
        }
        Err(StoreError::unavailable(format!(
            "no server takes {} sessions: {}",
            self.attrs.as_str(),
            reasons.join("; ")
        )))
    }
}

/// Whether the server `conn` is connected to takes `attrs` sessions.
pub(crate) async fn accepts(
    conn: &mut PgConnection,
    attrs: SessionAttrs,
) -> Result<bool, sqlx::Error> {
    if attrs == SessionAttrs::Any {
        return Ok(true);
    }
    let row = sqlx::query(
        "SELECT pg_is_in_recovery() AS standby, \
         current_setting('transaction_read_only') = 'on' AS read_only",
    )
    .fetch_one(&mut *conn)
    .await?;
    let standby: bool = row.try_get("standby")?;
    let read_only: bool = row.try_get("read_only")?;
    Ok(match attrs {
        SessionAttrs::Any => true,
        SessionAttrs::ReadWrite => !read_only,
        SessionAttrs::Primary => !standby,
    })
}

/// The URL of the server `url` names that takes its sessions now: `url` itself when it names
/// one server, else the first of its servers that answers and takes them. For connections
/// that cannot go through a pool, such as the WAL relay's replication stream.
pub async fn current_server_url(url: &str) -> Result<String, StoreError> {
    let hosts = Hosts::parse(url)?;
    if hosts.is_plain() {
        return Ok(url.to_owned());
    }
    let (i, conn) = hosts.find(Duration::from_secs(5)).await?;
    drop(conn);
    Ok(hosts.hosts[i].url.clone())
}

/// The URL of the first server `url` names, with the rest of the URL: for reading what every
/// server shares (the database's name) without connecting.
pub fn first_server_url(url: &str) -> Result<String, StoreError> {
    let hosts = Hosts::parse(url)?;
    Ok(hosts
        .hosts
        .into_iter()
        .next()
        .map(|h| h.url)
        .unwrap_or_else(|| url.to_owned()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_server_with_the_rest_of_the_url() {
        let h = Hosts::parse(
            "postgres://u:p@a:5432,b:5433/km0?sslmode=disable&target_session_attrs=primary",
        )
        .unwrap();
        assert_eq!(h.attrs, SessionAttrs::Primary);
        let urls: Vec<&str> = h.hosts.iter().map(|h| h.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "postgres://u:p@a:5432/km0?sslmode=disable",
                "postgres://u:p@b:5433/km0?sslmode=disable"
            ]
        );
        assert_eq!(h.hosts[1].options.get_port(), 5433);
        assert_eq!(h.names(), "a:5432,b:5433");
        assert!(!h.is_plain());
    }

    #[test]
    fn several_servers_default_to_read_write_and_one_to_any() {
        let two = Hosts::parse("postgres://u@a,b/db").unwrap();
        assert_eq!(two.attrs, SessionAttrs::ReadWrite);
        assert_eq!(two.hosts[0].url, "postgres://u@a/db");
        let one = Hosts::parse("postgres://u@a:5432").unwrap();
        assert!(one.is_plain());
        let checked = Hosts::parse("postgres://u@a:5432?target_session_attrs=read-write").unwrap();
        assert!(!checked.is_plain());
        assert_eq!(checked.hosts[0].url, "postgres://u@a:5432");
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        assert!(Hosts::parse("postgres://u@a,,b/db").is_err());
        assert!(Hosts::parse("postgres://u@a,b/db?target_session_attrs=standby").is_err());
        assert!(Hosts::parse("nonsense").is_err());
    }
}
