//! Classifying driver errors into transient (`Unavailable`) and permanent (`Rejected`).

use entrega_core::StoreError;

/// SQLite primary result codes after which the same operation may succeed later.
const TRANSIENT_CODES: [i32; 8] = [
    5,  // SQLITE_BUSY: another connection holds the lock past busy_timeout
    6,  // SQLITE_LOCKED: a table lock in shared-cache mode
    7,  // SQLITE_NOMEM
    9,  // SQLITE_INTERRUPT
    10, // SQLITE_IOERR
    13, // SQLITE_FULL: the disk may get space back
    14, // SQLITE_CANTOPEN
    15, // SQLITE_PROTOCOL: WAL lock protocol race
];

/// Classifies a driver error: lock contention, I/O and pool exhaustion become
/// [`StoreError::Unavailable`] (worth retrying); everything else (constraint violations,
/// syntax errors, decoding failures, a closed pool) becomes [`StoreError::Rejected`].
pub fn classify(e: sqlx::Error) -> StoreError {
    if is_transient(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::rejected(e)
    }
}

fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            // Extended codes carry the primary code in their low byte.
            .is_some_and(|code| TRANSIENT_CODES.contains(&(code & 0xff))),
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_exhaustion_and_io_are_transient() {
        assert!(classify(sqlx::Error::PoolTimedOut).is_transient());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(classify(sqlx::Error::Io(io)).is_transient());
    }

    #[test]
    fn decoding_and_missing_rows_are_permanent() {
        assert!(!classify(sqlx::Error::RowNotFound).is_transient());
        assert!(!classify(sqlx::Error::PoolClosed).is_transient());
        assert!(matches!(
            classify(sqlx::Error::ColumnNotFound("x".into())),
            StoreError::Rejected { .. }
        ));
    }
}
