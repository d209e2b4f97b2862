//! What can go wrong with a script call, and which failures leave its outcome unknown.

use redis::{ErrorKind, RedisError, ServerErrorKind};

#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecError {
    /// The script may or may not have run: timeout, dropped or refused connection, I/O failure,
    /// or a server that was busy, loading, failing over or lost the script cache mid-call.
    /// Never assume failure: retry with the SAME operation id (the op record turns a retry of
    /// an applied operation into a replay of its first result).
    #[error("redis outcome unknown for operation {operation_id:?}: {source}")]
    Unknown {
        operation_id: String,
        source: RedisError,
    },
    /// Redis answered with an error reply: a script refused its arguments, an operation id was
    /// reused for another action or reservation, the stored numbers break an invariant, or the
    /// server refused the command (WRONGTYPE, NOPERM, …). The scripts raise before their first
    /// write, so nothing was applied, but retrying the same call will fail the same way.
    #[error("redis refused operation {operation_id:?}: {source}")]
    Rejected {
        operation_id: String,
        source: RedisError,
    },
    /// The script ran but its reply does not have the expected shape (a script/code version
    /// mismatch). Whether it changed anything is unknown; do not retry blindly.
    #[error("unexpected redis reply for operation {operation_id:?}: {detail}")]
    Protocol {
        operation_id: String,
        detail: String,
    },
    /// Refused before any I/O (empty operation id, zero quantity, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl ExecError {
    /// The operation the error is about ("" for an invalid argument).
    pub fn operation_id(&self) -> &str {
        match self {
            ExecError::Unknown { operation_id, .. }
            | ExecError::Rejected { operation_id, .. }
            | ExecError::Protocol { operation_id, .. } => operation_id,
            ExecError::InvalidArgument(_) => "",
        }
    }

    /// The same error told about `operation_id`: one failed call of a group, to each item.
    pub fn for_operation(&self, operation_id: &str) -> Self {
        let mut err = self.clone();
        if let ExecError::Unknown {
            operation_id: op, ..
        }
        | ExecError::Rejected {
            operation_id: op, ..
        }
        | ExecError::Protocol {
            operation_id: op, ..
        } = &mut err
        {
            *op = operation_id.to_string();
        }
        err
    }

    /// True when the outcome is unknown and the caller must retry with the same operation id.
    pub fn is_unknown(&self) -> bool {
        matches!(self, ExecError::Unknown { .. })
    }

    /// A script refused because the stored numbers break an invariant (negative, or not
    /// adding up): the oversell alarm. Someone edited the hash outside the scripts.
    pub fn is_invariant_violation(&self) -> bool {
        matches!(self, ExecError::Rejected { source, .. } if source.to_string().contains("invariant violated"))
    }

    /// Sorts a Redis error into `Unknown` (may have run / worth retrying) or `Rejected`.
    pub fn from_redis(operation_id: &str, source: RedisError) -> Self {
        let operation_id = operation_id.to_string();
        if outcome_unknown(&source) {
            ExecError::Unknown {
                operation_id,
                source,
            }
        } else {
            ExecError::Rejected {
                operation_id,
                source,
            }
        }
    }
}

/// Whether a Redis error leaves the outcome of a write unknown (or at least retryable with the
/// same operation id). Errors that say "this command was refused on its merits" (ERR from a
/// script, WRONGTYPE, NOPERM, CROSSSLOT) are not: repeating them cannot help.
pub fn outcome_unknown(err: &RedisError) -> bool {
    if err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
    {
        return true;
    }
    if matches!(
        err.kind(),
        // A reply we could not parse may belong to a command that ran.
        ErrorKind::Io
            | ErrorKind::Parse
            | ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::TryAgain
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    // A SCRIPT FLUSH between redis-rs' reload and its second EVALSHA.
                    | ServerErrorKind::NoScript
            )
    ) {
        return true;
    }
    // Codes redis-rs has no kind for: a script running too long elsewhere, out of memory, a
    // failing RDB save refusing writes, missing replicas. All refuse the command before it
    // runs and clear up by themselves.
    matches!(
        err.code(),
        Some("BUSY" | "OOM" | "MISCONF" | "NOREPLICAS" | "LOADING" | "TRYAGAIN")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_unknown_and_script_errors_are_not() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(ExecError::from_redis("op", io).is_unknown());
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(ExecError::from_redis("op", timeout).is_unknown());
        let refused = RedisError::from((ErrorKind::Client, "bad argument"));
        assert!(!ExecError::from_redis("op", refused).is_unknown());
    }
}
