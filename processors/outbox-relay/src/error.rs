//! The relay's error type and what the one classifier ([`stocksvr_pipeline::failure`]) means
//! for the relay: which errors it waits out and which stop it.
//!
//! Kafka and codec failures never surface here: they belong to a single row, which goes to
//! RETRY with the reason. What is left is the database and the configuration.

use stocksvr_pipeline::failure::{sqlx_class, Class};

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
    /// conflict, read-only during a failover): the run loop backs off and tries again.
    /// Anything else (a missing table or privilege, a closed pool, a bad configuration) is
    /// fatal and stops the relay, so it is fixed instead of spinning.
    pub fn is_retryable(&self) -> bool {
        match self {
            RelayError::Mysql(e) => sqlx_is_retryable(e),
            RelayError::Config(_) => false,
        }
    }
}

/// A MySQL error the relay waits out: what the classifier calls unavailable.
///
/// The classifier's invalid (data the server refuses) is fatal here: the relay writes only
/// statuses, counters, times and a truncated reason into its own rows, so MySQL refusing
/// one of those is a bug or a schema the build does not expect, not a record to set aside.
/// An error number the classifier does not know counts as unavailable, as for every
/// processor: the relay runs inside `stocksvr all`, where a fatal error stops the Try API
/// too, while a round that keeps failing is logged at every backoff and shows in the
/// backlog gauges.
pub(crate) fn sqlx_is_retryable(e: &sqlx::Error) -> bool {
    sqlx_class(e) == Class::Unavailable
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
        // A closed pool never opens again.
        assert!(!RelayError::Mysql(sqlx::Error::PoolClosed).is_retryable());
        assert!(!RelayError::Config("x".into()).is_retryable());
    }
}
