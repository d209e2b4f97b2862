//! The one place that decides what a database error means for a batch.

use sqlx::mysql::MySqlDatabaseError;
use stocksvr_pipeline::consumer::Failure;

/// Server errors that say this build runs against a database it was not migrated for (or
/// without the privileges it needs): 1054 unknown column, 1142 command denied on a table,
/// 1146 table does not exist.
const SCHEMA_ERRORS: [u16; 3] = [1054, 1142, 1146];

#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    /// The inbox's `consumer_group` is VARCHAR(64) and part of its key.
    #[error(
        "consumer group {0:?} must be 1 to 64 characters (inventory_consumer_inbox.consumer_group)"
    )]
    InvalidGroup(String),
}

/// Classifies a failed batch.
///
/// A schema error is fatal: retrying cannot help, and dead-lettering would push every
/// record of the topic to the DLT, whereas stopping keeps the offsets where they are until
/// the database is migrated. Everything else (connection lost, pool timeout, deadlock, lock
/// wait timeout) is retryable: the loop retries the batch, then record by record, so one
/// record the database keeps refusing ends in the DLT without taking its neighbours along.
/// Values strict mode would refuse never get this far: [`crate::decide`] rejects them.
pub fn classify(error: &sqlx::Error) -> Failure {
    let schema = match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| SCHEMA_ERRORS.contains(&e.number())),
        _ => false,
    };
    if schema {
        Failure::Fatal(format!("database schema: {error}"))
    } else {
        Failure::from_sqlx(error)
    }
}
