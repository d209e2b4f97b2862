//! The three error classes of every processor, decided in one place (rust-arroyo's
//! `kafka_commit_error_is_retryable` idea): a record is **invalid** (it can never apply:
//! dead-letter it and move on), its **dependency is unavailable** (MySQL, Redis, the schema
//! registry or Kafka is down or stalled: wait, never dead-letter), or the failure is **fatal**
//! (a bug or a lost invariant: stop without committing past it). Processors map their own
//! errors onto these with the classifiers here, so MariaDB's error 1213 means the same thing
//! to the projector, the relay and the order-lifecycle processor, and a Kafka cluster that
//! refuses this process (a wrong password, an untrusted certificate, a missing ACL) means
//! waiting to all of them.

use rdkafka::types::RDKafkaErrorCode;
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
/// - Fatal: the schema is not what this build expects (missing table or column), a
///   privilege it needs is missing ([`is_access_denied`]), a value read back does not
///   decode, or the pool was closed: a deployment or code problem, not the record's, and
///   nothing that waiting repairs. Stopping (exit non-zero) keeps the offsets where they
///   are and says so at once; a pause would look like an outage that never ends.
pub fn sqlx_class(e: &sqlx::Error) -> Class {
    use sqlx::Error as E;
    match e {
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolTimedOut | E::WorkerCrashed => {
            Class::Unavailable
        }
        // Only `Pool::close` closes a pool, and a closed pool never opens again: retrying
        // would wait for nothing.
        E::PoolClosed => Class::Fatal,
        E::Database(_) => {
            match mysql_number(e).and_then(mysql_errors::kind) {
                Some(Kind::BadData) => Class::Invalid,
                Some(Kind::SchemaBehind | Kind::Denied) => Class::Fatal,
                // A refused login (wrong password, a user that must come over TLS): fixed
                // outside the process, after which the pool's next connection succeeds. A
                // missing privilege (Denied) stays fatal: it fails one statement with the
                // server's own words, where exiting names it at once, while a refused login
                // fails every connection and `/readyz` names it.
                Some(Kind::Refused) => Class::Unavailable,
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

/// The server's error number of a MySQL/MariaDB error, if it is one.
fn mysql_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// True when the server refused a statement for lack of a privilege: 1142 on a table
/// (ER_TABLEACCESS_DENIED_ERROR), 1143 on a column, 1044 on a database, 1227 a global one
/// such as PROCESS (ER_SPECIFIC_ACCESS_DENIED_ERROR). Fatal for [`sqlx_class`]; a caller
/// with a fallback for a privilege it only prefers (the relay's read of
/// `information_schema.INNODB_TRX`) asks this first.
pub fn is_access_denied(e: &sqlx::Error) -> bool {
    mysql_number(e).and_then(mysql_errors::kind) == Some(Kind::Denied)
}

/// True when the transaction lost a lock conflict: InnoDB chose it as a deadlock victim
/// (1213) or it waited past `innodb_lock_wait_timeout` (1205). The server rolled its work
/// back, so running it again is safe and usually the whole answer; [`sqlx_class`] calls
/// both unavailable for a caller that does not retry on the spot.
pub fn is_lock_conflict(e: &sqlx::Error) -> bool {
    mysql_number(e).is_some_and(mysql_errors::is_lock_conflict)
}

/// How a Kafka cluster refused this process: the causes [`crate::causes`] names once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The SASL password (or mechanism) was not accepted.
    Authentication,
    /// The TLS handshake failed: a broker certificate this process does not trust, a host
    /// name it does not carry, a client certificate the broker refuses.
    Tls,
    /// An ACL is missing; names the resource kind (`topic`, `group`, `cluster`,
    /// `transactional id`).
    Authorization(&'static str),
}

/// The refusal a librdkafka error code (with the text that came with it) stands for.
pub fn kafka_refusal(code: RDKafkaErrorCode, text: &str) -> Option<Refusal> {
    use RDKafkaErrorCode as C;
    match code {
        C::Authentication | C::SaslAuthenticationFailed => Some(Refusal::Authentication),
        C::SSL => Some(Refusal::Tls),
        // librdkafka reports a failed handshake as a transport failure.
        C::BrokerTransportFailure if text.contains("SSL handshake failed") => Some(Refusal::Tls),
        C::TopicAuthorizationFailed => Some(Refusal::Authorization("topic")),
        C::GroupAuthorizationFailed => Some(Refusal::Authorization("group")),
        C::ClusterAuthorizationFailed => Some(Refusal::Authorization("cluster")),
        C::TransactionalIdAuthorizationFailed => Some(Refusal::Authorization("transactional id")),
        _ => None,
    }
}

/// Kafka errors (of a produce, a fetch, a metadata or admin request) by what waiting can
/// do about them.
///
/// - Unavailable: the cluster is unreachable, stalled, electing leaders or rebalancing;
///   and also every refusal ([`kafka_refusal`]): a wrong password, an untrusted
///   certificate, a missing ACL. A refusal is fixed outside this process (the password
///   rotated back, the ACL added again), after which librdkafka's own retries succeed with
///   nothing restarted, so the processors wait with their offsets where they are, `/readyz`
///   and one log line name the cause, and nothing is dead-lettered. Stopping instead would
///   take the Try API down with the processor (`stocksvr all`) for what an operator fixes
///   in a minute, and restart into the same refusal.
/// - Invalid: a record the broker can never take as it is (too large, corrupt).
/// - Fatal: the client itself is unusable (its configuration refused, the idempotent
///   producer fenced or in librdkafka's fatal state): a new process is the only way on.
///
/// A code this list does not name is taken for an outage, as for MySQL: waiting is safe,
/// dead-lettering a record the cluster could take later is not.
pub fn kafka_class(code: RDKafkaErrorCode) -> Class {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge | C::InvalidMessage | C::InvalidRecord => Class::Invalid,
        C::Fatal
        | C::Fenced
        | C::ProducerFenced
        | C::InvalidConfig
        | C::InvalidArgument
        | C::UnsupportedVersion => Class::Fatal,
        _ => Class::Unavailable,
    }
}

/// The class of a rust-rdkafka error: by its code when it has one; a client that could
/// not be made or configured is fatal, anything else without a code is an outage.
pub fn kafka_error_class(e: &rdkafka::error::KafkaError) -> Class {
    use rdkafka::error::KafkaError as E;
    match e {
        E::ClientConfig(..) | E::ClientCreation(_) | E::Nul(_) => Class::Fatal,
        _ => e
            .rdkafka_error_code()
            .map_or(Class::Unavailable, kafka_class),
    }
}

/// A MySQL error in one line that names its cause, for `/readyz` and the one log line of
/// an outage: `TLS: invalid peer certificate: UnknownIssuer`, the server's own message for
/// a refused login, sqlx's text otherwise.
pub fn describe_sqlx(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Tls(inner) => format!("TLS: {inner}"),
        sqlx::Error::Database(db) => match mysql_number(e) {
            Some(n) => format!("{} ({n})", db.message()),
            None => db.message().to_string(),
        },
        // sqlx hands rustls' verdict on the server's certificate over as an I/O error.
        sqlx::Error::Io(io) => match io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(tls) => format!("TLS: {tls}"),
            None => format!("connection: {io}"),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_refusals_are_waited_out_and_named() {
        use RDKafkaErrorCode as C;
        for code in [
            C::Authentication,
            C::SSL,
            C::TopicAuthorizationFailed,
            C::GroupAuthorizationFailed,
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::MessageTimedOut,
        ] {
            assert_eq!(kafka_class(code), Class::Unavailable, "{code:?}");
        }
        assert_eq!(kafka_class(C::MessageSizeTooLarge), Class::Invalid);
        assert_eq!(kafka_class(C::ProducerFenced), Class::Fatal);
        assert_eq!(
            kafka_refusal(C::Authentication, ""),
            Some(Refusal::Authentication)
        );
        assert_eq!(
            kafka_refusal(C::BrokerTransportFailure, "x: SSL handshake failed: y"),
            Some(Refusal::Tls)
        );
        assert_eq!(
            kafka_refusal(C::BrokerTransportFailure, "Connection refused"),
            None
        );
        assert_eq!(
            kafka_refusal(C::GroupAuthorizationFailed, ""),
            Some(Refusal::Authorization("group"))
        );
        let creation = rdkafka::error::KafkaError::ClientCreation("bad".into());
        assert_eq!(kafka_error_class(&creation), Class::Fatal);
    }

    #[test]
    fn a_mysql_failure_is_described_by_its_cause() {
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            untrusted,
        ));
        assert_eq!(
            describe_sqlx(&io),
            "TLS: invalid peer certificate: UnknownIssuer"
        );
        assert_eq!(sqlx_class(&io), Class::Unavailable);
        let refused = sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert!(describe_sqlx(&refused).starts_with("connection: "));
    }

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
    fn a_closed_pool_is_fatal_for_it_never_opens_again() {
        assert_eq!(sqlx_class(&sqlx::Error::PoolClosed), Class::Fatal);
        assert!(!is_access_denied(&sqlx::Error::PoolClosed));
        assert!(!is_lock_conflict(&sqlx::Error::PoolTimedOut));
    }

    #[test]
    fn decoding_what_the_schema_returns_is_fatal() {
        let e = sqlx::Error::ColumnNotFound("x".into());
        assert_eq!(sqlx_class(&e), Class::Fatal);
        assert!(matches!(Failure::from_sqlx(&e), Failure::Fatal(_)));
    }
}
