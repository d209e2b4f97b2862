//! The three error classes of every processor, decided in one place (rust-arroyo's
//! `kafka_commit_error_is_retryable` idea): a record is **invalid** (it can never apply:
//! dead-letter it and move on), its **dependency is unavailable** (MySQL, Redis, the schema
//! registry or Kafka is down or stalled: wait, never dead-letter), or the failure is **fatal**
//! (a bug or a lost invariant: stop without committing past it). Processors map their own
//! errors onto these with the classifiers here, so MariaDB's error 1213 means the same thing
//! to the projector, the relay and the order-lifecycle processor.

use std::fmt;
use stocksvr_core::mysql_errors::{self, Kind};

/// The server a record waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dependency {
    Mysql,
    Redis,
    SchemaRegistry,
    Kafka,
    /// An attempt that ran past its deadline without naming its cause.
    Other,
}

impl Dependency {
    /// The metric label (`consumer_pauses_total{dependency}`) and the name `/readyz` uses.
    pub const fn name(self) -> &'static str {
        match self {
            Dependency::Mysql => "mysql",
            Dependency::Redis => "redis",
            Dependency::SchemaRegistry => "schema_registry",
            Dependency::Kafka => "kafka",
            Dependency::Other => "other",
        }
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong with a record, decided by the processor's handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The record can never be applied (bad ids, failed validation): dead-letter it.
    Invalid(String),
    /// A dependency is unavailable: pause, retry without limit, resume by itself.
    Unavailable {
        dependency: Dependency,
        reason: String,
    },
    /// The processor cannot go on (a bug or a lost invariant): stop, exit non-zero.
    Fatal(String),
}

impl Failure {
    pub fn unavailable(dependency: Dependency, reason: impl fmt::Display) -> Self {
        Failure::Unavailable {
            dependency,
            reason: reason.to_string(),
        }
    }

    /// A MySQL error in its class (see [`sqlx_class`]).
    pub fn from_sqlx(e: &sqlx::Error) -> Self {
        match sqlx_class(e) {
            Class::Invalid => Failure::Invalid(format!("mysql refused the data: {e}")),
            Class::Unavailable => Failure::unavailable(Dependency::Mysql, e),
            Class::Fatal => Failure::Fatal(format!("mysql: {e}")),
        }
    }

    pub fn is_unavailable(&self) -> bool {
        matches!(self, Failure::Unavailable { .. })
    }
}

/// The class alone, for code that maps it onto its own error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Invalid,
    Unavailable,
    Fatal,
}

/// MySQL/MariaDB errors by what retrying can do about them (the server's error numbers are
/// sorted in [`stocksvr_core::mysql_errors`], the one list of them).
///
/// - Unavailable: the server is down, restarting, stalled (a statement past its deadline
///   surfaces as an I/O timeout), out of connections, read-only during a failover, or chose
///   this transaction as a deadlock victim / lock-wait loser (1205, 1213): the same work will
///   succeed later.
/// - Invalid: the data itself is refused (too long, out of range, wrong value, a constraint),
///   so the record can never be stored as it is.
/// - Fatal: the schema is not what this build expects (missing table or column) or a value
///   read back does not decode: a deployment or code problem, not the record's.
pub fn sqlx_class(e: &sqlx::Error) -> Class {
    use sqlx::Error as E;
    match e {
        E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed => Class::Unavailable,
        E::Database(db) => {
            let number = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(|m| m.number());
            match number.and_then(mysql_errors::kind) {
                Some(Kind::BadData) => Class::Invalid,
                Some(Kind::SchemaBehind) => Class::Fatal,
                // A number the list does not know is taken for an outage: waiting is safe,
                // dead-lettering a record the server could store later is not.
                Some(Kind::Transient) | None => Class::Unavailable,
            }
        }
        E::ColumnDecode { .. } | E::Decode(_) | E::ColumnNotFound(_) | E::TypeNotFound { .. } => {
            Class::Fatal
        }
        E::RowNotFound | E::ColumnIndexOutOfBounds { .. } => Class::Fatal,
        E::Configuration(_) | E::Migrate(_) => Class::Fatal,
        _ => Class::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_failures_are_outages() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(sqlx_class(&io), Class::Unavailable);
        assert_eq!(sqlx_class(&sqlx::Error::PoolTimedOut), Class::Unavailable);
        assert!(Failure::from_sqlx(&io).is_unavailable());
        assert!(matches!(
            Failure::from_sqlx(&io),
            Failure::Unavailable {
                dependency: Dependency::Mysql,
                ..
            }
        ));
    }

    #[test]
    fn decoding_what_the_schema_returns_is_fatal() {
        let e = sqlx::Error::ColumnNotFound("x".into());
        assert_eq!(sqlx_class(&e), Class::Fatal);
        assert!(matches!(Failure::from_sqlx(&e), Failure::Fatal(_)));
    }
}
