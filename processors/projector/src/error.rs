//! The projector's own error, and what a database failure means for a batch.
//!
//! A database failure is classified by the one classifier,
//! [`stocksvr_pipeline::failure::sqlx_class`] (through `Failure::from_sqlx`): a schema or
//! privilege error (1054 unknown column, 1146 missing table, 1142 command denied on a
//! table, ...) is fatal: retrying cannot help, and dead-lettering would push every record
//! of the topic to the DLT, whereas stopping keeps the offsets where they are until the
//! database is migrated or the grant given. Connection loss, pool timeout, deadlock and lock
//! wait timeout are unavailable: the loop retries the batch, then record by record, so one
//! record the database keeps refusing ends in the DLT without taking its neighbours along.
//! Values strict mode would refuse never get this far: [`crate::decide`] rejects them.

#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    /// Kafka refuses an empty group id.
    #[error("consumer group {0:?} must not be empty")]
    InvalidGroup(String),
}
