//! Classifying driver errors as transient (retry later) or permanent (give up).

use entrega_core::StoreError;

/// SQLSTATE codes after which repeating the operation may succeed.
///
/// `40001` serialization failure and `40P01` deadlock: the transaction lost a race;
/// `53300` too many connections; `57P01`-`57P03` the server is shutting down or starting.
const TRANSIENT_CODES: [&str; 8] = [
    "40001", "40P01", "53300", "57P01", "57P02", "57P03", "57014", "25P03",
];

/// Classifies a driver error: connection-level failures (I/O, a connection cut mid-message
/// seen as a protocol or TLS error, pool timeout or closed,
/// SQLSTATE class `08`) and lost races (`40001`, `40P01`), overload (`53300`), shutdown
/// (`57P01`-`57P03`), and a statement or idle transaction ended by its timeout (`57014`,
/// `25P03`) are [`StoreError::Unavailable`]; everything else is
/// [`StoreError::Rejected`].
pub fn classify(e: sqlx::Error) -> StoreError {
    if is_transient(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::rejected(e)
    }
}

fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        // A connection cut mid-message (over TLS, the record layer fails first) reaches the
        // driver as a protocol or TLS error rather than an I/O one: a fresh connection is
        // what the statement needs, as for any broken connection.
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // Class 08 covers every "connection exception".
            code.starts_with("08") || TRANSIENT_CODES.contains(&code.as_ref())
        }),
        _ => false,
    }
}

/// A permanent error for a caller's input the database cannot take (bad name,
/// out-of-range number).
pub(crate) fn invalid(reason: impl Into<String>) -> StoreError {
    StoreError::rejected(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_and_pool_errors_are_transient() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(classify(sqlx::Error::Io(io)).is_transient());
        assert!(classify(sqlx::Error::PoolTimedOut).is_transient());
        assert!(classify(sqlx::Error::PoolClosed).is_transient());
    }

    #[test]
    fn decoding_errors_are_permanent() {
        assert!(!classify(sqlx::Error::RowNotFound).is_transient());
        assert!(!classify(sqlx::Error::ColumnNotFound("x".into())).is_transient());
    }

    #[test]
    fn a_connection_cut_mid_message_is_transient() {
        let cut = "expected to read 5 bytes, got 0 bytes at EOF";
        assert!(classify(sqlx::Error::Protocol(cut.into())).is_transient());
        let tls = std::io::Error::new(std::io::ErrorKind::InvalidData, "close_notify missing");
        assert!(classify(sqlx::Error::Tls(Box::new(tls))).is_transient());
    }
}
