//! MariaDB/MySQL server error numbers by what running the same work again can do about them:
//! the one list of them in stocksvr. `stocksvr_pipeline::failure` maps the kinds onto its
//! classes (invalid, unavailable, fatal) and the store runs a statement again after a lock
//! conflict; both read the numbers here. No I/O: callers take the number off sqlx's
//! `MySqlDatabaseError::number()`.

/// What a server error number says about the work that got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The server is down, restarting, stalled, out of connections, read-only during a
    /// failover, or chose this work as a lock conflict's loser: the same work succeeds later.
    Transient,
    /// The data itself is refused (too long, out of range, a wrong value, a constraint): it
    /// can never be stored as it is.
    BadData,
    /// A table, column or database this build expects is missing: the schema is behind the
    /// code, a deployment problem rather than the data's.
    SchemaBehind,
    /// A privilege this build needs is missing: a deployment problem too, which waiting
    /// does not repair.
    Denied,
    /// The server refused the login itself (a wrong password, a user that must connect
    /// over TLS): repaired outside the process, by the credentials or the server.
    Refused,
}

/// Lock wait timeout (`ER_LOCK_WAIT_TIMEOUT`).
pub const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// Deadlock victim (`ER_LOCK_DEADLOCK`): InnoDB rolled the transaction back.
pub const DEADLOCK: u16 = 1213;

/// The kind of server error `number`; `None` for a number this list does not know.
pub const fn kind(number: u16) -> Option<Kind> {
    match number {
        // Lock wait timeout, deadlock, too many connections, server shutdown, read-only
        // (failover), lost connection codes the server sends, max_statement_time, an idle
        // connection the server closed (4031).
        LOCK_WAIT_TIMEOUT | DEADLOCK | 1040 | 1053 | 1290 | 1836 | 2006 | 2013 | 1927 | 1969
        | 3024 | 4031 => Some(Kind::Transient),
        // Data too long, out of range, incorrect value, null into NOT NULL, check, foreign
        // key, duplicate entry not handled by the caller.
        1406 | 1264 | 1366 | 1292 | 1048 | 3819 | 1452 | 1062 => Some(Kind::BadData),
        // Unknown table or column, unknown database.
        1146 | 1054 | 1049 => Some(Kind::SchemaBehind),
        // No privilege on a table (1142), a column (1143), a database (1044), or a global
        // one such as PROCESS (1227).
        1142 | 1143 | 1044 | 1227 => Some(Kind::Denied),
        // Access denied for the user (1045; MariaDB's answer to a plaintext login of a
        // `REQUIRE SSL` user too), MySQL's refusal of an insecure transport (3159).
        1045 | 3159 => Some(Kind::Refused),
        _ => None,
    }
}

/// InnoDB broke a lock conflict by failing this statement (a lock wait timeout) or rolling
/// back this transaction (a deadlock): nothing of it happened, so running it again is safe.
pub const fn is_lock_conflict(number: u16) -> bool {
    matches!(number, LOCK_WAIT_TIMEOUT | DEADLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_conflicts_are_transient_and_nothing_else_is_a_lock_conflict() {
        for n in [LOCK_WAIT_TIMEOUT, DEADLOCK] {
            assert!(is_lock_conflict(n));
            assert_eq!(kind(n), Some(Kind::Transient));
        }
        assert!(!is_lock_conflict(1040));
        assert!(!is_lock_conflict(1062));
        assert_eq!(kind(1062), Some(Kind::BadData));
        assert_eq!(kind(1146), Some(Kind::SchemaBehind));
        assert_eq!(kind(1142), Some(Kind::Denied));
        assert_eq!(kind(1045), Some(Kind::Refused));
        assert_eq!(kind(1), None);
    }
}
