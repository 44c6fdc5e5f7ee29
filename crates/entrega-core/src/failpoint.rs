//! Named failure points for crash tests.
//!
//! A failpoint is a place in the engine where a test can make the process die or a step fail,
//! chosen at run time through the environment variable `ENTREGA_FAILPOINTS`, read once.
//! They exist only in builds with the cargo feature `failpoints` (the test suites enable it
//! through their dev-dependencies); in every other build [`hit`] does nothing, the variable
//! is never read, and [`configure`] fails with [`FailpointError::Disabled`]:
//!
//! ```text
//! ENTREGA_FAILPOINTS="relay.after_publish=exit,worker.after_handler=error"
//! ```
//!
//! Actions: `exit` ends the process at once with status 137, as `kill -9` would (no
//! destructors, no flushing, no clean shutdown); `error` makes [`hit`] return an error, which
//! the caller treats as a failure of that step. Unlisted failpoints cost one map lookup.
//!
//! | failpoint | where |
//! |---|---|
//! | [`RELAY_BEFORE_PUBLISH`] | relay, rows read, before publishing them |
//! | [`RELAY_AFTER_PUBLISH`] | relay, publish confirmed, before marking the rows published |
//! | [`WAL_AFTER_MARK`] | WAL relay, published rows marked, before their position is confirmed to PostgreSQL |
//! | [`WORKER_AFTER_HANDLER`] | worker, handler's transaction committed, before the offset commit |
//! | [`WORKER_BEFORE_COMMIT`] | worker, outcomes final, right before committing offsets |
//! | [`KAFKA_TRANSFORM_BEFORE_COMMIT`] | Kafka transformer, the batch's records acknowledged inside the open transaction, before its offsets and commit |

use std::collections::HashMap;
#[cfg(feature = "failpoints")]
use std::sync::{OnceLock, RwLock};

/// Environment variable listing the active failpoints.
pub const ENV: &str = "ENTREGA_FAILPOINTS";
/// Whether this build has failpoints (cargo feature `failpoints`).
pub const ENABLED: bool = cfg!(feature = "failpoints");
/// Relay: rows read, before publishing them.
pub const RELAY_BEFORE_PUBLISH: &str = "relay.before_publish";
/// Relay: publish confirmed, before marking the rows published.
pub const RELAY_AFTER_PUBLISH: &str = "relay.after_publish";
/// WAL relay: published rows marked, before their position is confirmed to PostgreSQL.
pub const WAL_AFTER_MARK: &str = "wal.after_mark";
/// Worker: the handler returned (its transaction committed), before the offset commit.
pub const WORKER_AFTER_HANDLER: &str = "worker.after_handler";
/// Worker: outcomes are final, right before committing offsets.
pub const WORKER_BEFORE_COMMIT: &str = "worker.before_commit";

/// After a saga's reply moved it and its transaction committed, before the worker
/// acknowledges the reply (the reply comes again and is recognised by its inbox key).
pub const SAGA_AFTER_COMMIT: &str = "saga.after_commit";

/// Kafka transformer: the batch's records are acknowledged inside the open transaction,
/// before the offsets are added and the transaction committed.
pub const KAFKA_TRANSFORM_BEFORE_COMMIT: &str = "kafka.transform.before_commit";

/// What a failpoint does when hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `std::process::exit(137)`: the process dies without any cleanup.
    Exit,
    /// [`hit`] returns [`FailpointError::Triggered`].
    Error,
}

/// A failpoint fired, or a failpoint specification could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailpointError {
    /// The failpoint is set to `error`.
    #[error("failpoint `{name}` triggered")]
    Triggered {
        /// The failpoint's name.
        name: String,
    },
    /// This build has no failpoints (feature `failpoints` off).
    #[error("failpoints are not compiled into this build (cargo feature `failpoints`)")]
    Disabled,
    /// An entry of a specification is not `name=exit` or `name=error`.
    #[error("invalid failpoint entry `{entry}`: expected `name=exit` or `name=error`")]
    Invalid {
        /// The offending entry.
        entry: String,
    },
}

#[cfg(feature = "failpoints")]
fn points() -> &'static RwLock<HashMap<String, Action>> {
    static POINTS: OnceLock<RwLock<HashMap<String, Action>>> = OnceLock::new();
    POINTS.get_or_init(|| {
        let spec = std::env::var(ENV).unwrap_or_default();
        let parsed = parse(&spec).unwrap_or_else(|e| {
            // A typo must not silently disable a crash test, but must not crash production.
            tracing::error!(error = %e, "ignoring {ENV}");
            HashMap::new()
        });
        RwLock::new(parsed)
    })
}

/// Parses `name=action` entries separated by commas; blank entries are skipped.
pub fn parse(spec: &str) -> Result<HashMap<String, Action>, FailpointError> {
    let mut out = HashMap::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let invalid = || FailpointError::Invalid {
            entry: entry.to_owned(),
        };
        let (name, action) = entry.split_once('=').ok_or_else(invalid)?;
        let action = match action.trim() {
            "exit" => Action::Exit,
            "error" => Action::Error,
            _ => return Err(invalid()),
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(invalid());
        }
        out.insert(name.to_owned(), action);
    }
    Ok(out)
}

/// Replaces the active failpoints for the whole process (the environment is not read again).
/// Meant for tools and single-purpose test processes; tests sharing a process share this.
#[cfg(not(feature = "failpoints"))]
pub fn configure(spec: &str) -> Result<(), FailpointError> {
    parse(spec)?;
    Err(FailpointError::Disabled)
}

/// Passes the failpoint `name`: a build without failpoints does nothing here.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) -> Result<(), FailpointError> {
    Ok(())
}

/// Replaces the active failpoints for the whole process (the environment is not read again).
/// Meant for tools and single-purpose test processes; tests sharing a process share this.
#[cfg(feature = "failpoints")]
pub fn configure(spec: &str) -> Result<(), FailpointError> {
    let parsed = parse(spec)?;
    let mut guard = points().write().unwrap_or_else(|e| e.into_inner());
    *guard = parsed;
    Ok(())
}

/// Passes the failpoint `name`: does nothing unless it is active, exits the process for
/// `exit`, returns an error for `error`.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) -> Result<(), FailpointError> {
    let action = {
        let guard = points().read().unwrap_or_else(|e| e.into_inner());
        guard.get(name).copied()
    };
    match action {
        None => Ok(()),
        Some(Action::Exit) => {
            tracing::warn!(failpoint = name, "failpoint: exiting with status 137");
            std::process::exit(137)
        }
        Some(Action::Error) => Err(FailpointError::Triggered {
            name: name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_rejects_garbage() {
        let points = parse(" relay.after_publish=exit, worker.after_handler=error ,").ok();
        let points = points.unwrap_or_default();
        assert_eq!(points.get("relay.after_publish"), Some(&Action::Exit));
        assert_eq!(points.get("worker.after_handler"), Some(&Action::Error));
        assert_eq!(points.len(), 2);
        assert!(parse("relay.after_publish").is_err());
        assert!(parse("relay.after_publish=explode").is_err());
        assert!(parse("=exit").is_err());
        assert_eq!(parse("").map(|p| p.len()), Ok(0));
    }

    #[test]
    #[cfg(not(feature = "failpoints"))]
    fn a_build_without_failpoints_never_fails_a_step() {
        assert_eq!(configure("test.point=error"), Err(FailpointError::Disabled));
        assert_eq!(hit("test.point"), Ok(()));
    }

    #[test]
    #[cfg(feature = "failpoints")]
    fn error_action_fails_the_step() {
        // The only test in this binary touching the process-wide table, with its own names.
        assert!(configure("test.point=error").is_ok());
        assert_eq!(
            hit("test.point"),
            Err(FailpointError::Triggered {
                name: "test.point".into()
            })
        );
        assert_eq!(hit("test.other"), Ok(()));
        assert!(configure("").is_ok());
        assert_eq!(hit("test.point"), Ok(()));
    }
}
