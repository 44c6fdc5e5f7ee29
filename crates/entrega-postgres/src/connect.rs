//! Opening pools and creating databases.

use std::time::Duration;

use entrega_core::StoreError;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection;

use crate::errors::{classify, invalid};
use crate::failover::{self, Moved, PROBE_TIMEOUT};
use crate::hosts::{accepts, Hosts};

/// Connections per pool: enough for a relay, a few consumers and the listeners that each
/// outbox or log handle keeps open, without crowding a default server (100 connections).
const MAX_CONNECTIONS: u32 = 20;

/// Session settings entrega's pools set unless the URL's `options` set them: statement and
/// idle-in-transaction timeouts, and the server's TCP keepalive probes.
pub const SESSION_LIMITS: [(&str, &str); 5] = [
    ("statement_timeout", "1min"),
    ("idle_in_transaction_session_timeout", "1min"),
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
];

/// The session setting that tells the outbox's trigger not to `NOTIFY` in the transaction:
/// entrega's sessions notify the relays once the transaction has committed (see `Tx::commit`
/// in `entrega`), so commits that write to the outbox do not wait for each other's disk write
/// on the server's one notification lock.
pub const NOTIFY_AFTER_COMMIT: (&str, &str) = ("entrega.notify", "after_commit");

/// Opens a pool on a full database URL (`postgres://user@host:port/db`), checking that the
/// server answers.
///
/// Its sessions run with `jit = off`. entrega's statements are short and prepared, and the
/// relay's lane read estimates above `jit_above_cost` (its `LIMIT` inside a lateral join),
/// so each of a connection's first custom plans spent about 15 ms compiling a statement that
/// runs in under 20 ms, on the cores the rest of the round needs.
///
/// They also run with limits, so a stuck client or a half-open connection holds nothing
/// for long ([`SESSION_LIMITS`]): a statement is cancelled after 60 s, a transaction left
/// idle is ended after 60 s (its locks and leases released), and the server probes an idle
/// connection after 10 s of silence, dropping it after 3 unanswered probes 5 s apart. A
/// setting the URL's `options` names itself (`?options=-c%20statement_timeout%3D5s`) is
/// left as the URL says.
///
/// A URL may name several servers, as libpq's do:
/// `postgres://user@primary:5432,standby:5432/db?target_session_attrs=read-write`. The pool
/// then opens its connections on the first server, in that order, that takes the sessions
/// wanted (`read-write` by default with several servers, or `primary`), checks each new
/// connection again, and keeps a task that watches the server until the pool is closed. When
/// that server is lost or stops taking writes (a failover), the task finds the one that
/// does and moves the pool there: statements fail with transient errors meanwhile, which
/// every caller retries, and the connections of the old server are not handed out again.
pub async fn connect(url: &str) -> Result<PgPool, StoreError> {
    let hosts = Hosts::parse(url)?;
    if hosts.is_plain() {
        let options = with_session_defaults(hosts.hosts[0].options.clone());
        return pool_options().connect_with(options).await.map_err(classify);
    }
    let (current, monitor) = hosts.find(PROBE_TIMEOUT).await?;
    let moved = Moved::default();
    let attrs = hosts.attrs;
    let (on_acquire, on_release) = (moved.clone(), moved.clone());
    let pool = pool_options()
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if accepts(conn, attrs).await? {
                    Ok(())
                } else {
                    Err(sqlx::Error::Io(std::io::Error::other(format!(
                        "the server does not take {} sessions",
                        attrs.as_str()
                    ))))
                }
            })
        })
        .before_acquire(move |_, meta| {
            let keep = !on_acquire.before(meta.age);
            Box::pin(async move { Ok(keep) })
        })
        .after_release(move |_, meta| {
            let keep = !on_release.before(meta.age);
            Box::pin(async move { Ok(keep) })
        })
        .connect_with(with_session_defaults(hosts.hosts[current].options.clone()))
        .await
        .map_err(classify)?;
    tokio::spawn(failover::watch(
        pool.clone(),
        hosts,
        current,
        monitor,
        moved,
    ));
    Ok(pool)
}

/// The pool's settings, whatever the servers.
fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(Duration::from_secs(10))
        // No ping on every checkout: it is a round trip of its own, doubling the cost of the
        // single statements the relay and the log transport mostly issue. A connection that
        // died idle fails its next statement with an I/O error instead, which `classify`
        // reports as transient, and every caller retries those.
        .test_before_acquire(false)
}

/// `options` with `jit = off` and [`SESSION_LIMITS`], except what its `options` set.
pub(crate) fn with_session_defaults(options: PgConnectOptions) -> PgConnectOptions {
    let given = options.get_options().unwrap_or("").to_owned();
    let defaults = [("jit", "off"), NOTIFY_AFTER_COMMIT]
        .into_iter()
        .chain(SESSION_LIMITS.iter().copied())
        .filter(|(name, _)| !given.contains(name));
    options.options(defaults)
}

/// One connection to the server `url` names, or to the one of its servers that takes its
/// sessions now.
async fn connect_one(url: &str) -> Result<PgConnection, StoreError> {
    let hosts = Hosts::parse(url)?;
    if hosts.is_plain() {
        return PgConnection::connect(url).await.map_err(classify);
    }
    Ok(hosts.find(PROBE_TIMEOUT).await?.1)
}

/// Creates database `name` on the server at `server_url` unless it exists, and returns the
/// URL of that database (the server URL with its path replaced by `name`).
///
/// Safe to race: a concurrent creation of the same name counts as success. `name` is limited
/// to ASCII letters, digits, `_` and `-` so it needs no escaping in the URL.
pub async fn ensure_database(server_url: &str, name: &str) -> Result<String, StoreError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(invalid(format!("invalid database name `{name}`")));
    }
    let db_url = database_url(server_url, name)?;
    let mut conn = connect_one(server_url).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .map_err(classify)?;
    if !exists {
        let created = sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await;
        if let Err(e) = created {
            // 42P04: created meanwhile; 23505: two CREATEs raced on pg_database's unique index.
            let raced = matches!(&e, sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("42P04" | "23505")));
            if !raced {
                return Err(classify(e));
            }
        }
    }
    // Closing is a courtesy to the server; the database exists either way.
    let _ = conn.close().await;
    Ok(db_url)
}

/// `server_url` with its database path replaced by `name`, keeping any query string.
fn database_url(server_url: &str, name: &str) -> Result<String, StoreError> {
    let (base, query) = match server_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (server_url, None),
    };
    let Some(scheme_end) = base.find("://") else {
        return Err(invalid(format!(
            "not a postgres URL: `{}`",
            entrega_core::redact_url(server_url)
        )));
    };
    let authority_start = scheme_end + 3;
    let authority_end = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut url = format!("{}/{name}", &base[..authority_end]);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn replaces_or_adds_the_database_path() {
        let cases = [
            ("postgres://u@h:5432", "postgres://u@h:5432/x"),
            ("postgres://u@h:5432/", "postgres://u@h:5432/x"),
            ("postgres://u@h:5432/old", "postgres://u@h:5432/x"),
            (
                "postgres://u:p@h/old?sslmode=disable",
                "postgres://u:p@h/x?sslmode=disable",
            ),
        ];
        for (server, want) in cases {
            assert_eq!(
                database_url(server, "x").ok().as_deref(),
                Some(want),
                "{server}"
            );
        }
        assert!(database_url("nonsense", "x").is_err());
    }
}
