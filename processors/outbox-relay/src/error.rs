//! The relay's error type and the one place that decides which errors are worth retrying.
//!
//! Kafka and codec failures never surface here: they belong to a single row, which goes to
//! RETRY with the reason. What is left is the database and the configuration.

/// MySQL/MariaDB server error numbers that describe a passing condition, not a bug.
const RETRYABLE_MYSQL_ERRORS: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1205, // ER_LOCK_WAIT_TIMEOUT
    1213, // ER_LOCK_DEADLOCK
    1927, // MariaDB ER_CONNECTION_KILLED
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
    4031, // MySQL ER_CLIENT_INTERACTION_TIMEOUT
];

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The outbox table could not be read or written.
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    /// The relay was built with settings under which it cannot keep its guarantees.
    #[error("invalid relay configuration: {0}")]
    Config(String),
}

impl RelayError {
    /// True when the same call may succeed later (database down, connection lost, lock
    /// conflict): the run loop backs off and tries again. Anything else (a missing table, a
    /// bad configuration) is fatal and stops the relay, so it is fixed instead of spinning.
    pub fn is_retryable(&self) -> bool {
        match self {
            RelayError::Mysql(e) => sqlx_is_retryable(e),
            RelayError::Config(_) => false,
        }
    }
}

/// Classifies sqlx errors: transport problems and lock conflicts are retryable.
pub fn sqlx_is_retryable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| RETRYABLE_MYSQL_ERRORS.contains(&e.number())),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_are_retryable_and_config_errors_fatal() {
        assert!(RelayError::Mysql(sqlx::Error::PoolTimedOut).is_retryable());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(RelayError::Mysql(sqlx::Error::Io(io)).is_retryable());
        assert!(!RelayError::Mysql(sqlx::Error::RowNotFound).is_retryable());
        assert!(!RelayError::Mysql(sqlx::Error::PoolClosed).is_retryable());
        assert!(!RelayError::Config("x".into()).is_retryable());
    }
}
