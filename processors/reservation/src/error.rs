use stocksvr_core::reservation::ReservationStatus;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A field of the request is unacceptable (HTTP 400).
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// No such reservation (HTTP 404).
    #[error("reservation {0} not found")]
    NotFound(u64),
    /// No stock bucket for this merchant, dish and business day (HTTP 404).
    #[error("no stock bucket {0}")]
    BucketNotFound(String),
    /// The dish's stock is disabled or its bucket no longer takes Trys (HTTP 409).
    #[error("stock bucket {bucket} does not accept new reservations: {reason}")]
    BucketUnavailable {
        bucket: String,
        reason: &'static str,
    },
    /// Refund of more than the reservation still holds (HTTP 409).
    #[error("refund of {asked} exceeds the {held} units reservation {reservation_id} still holds")]
    OverRefund {
        reservation_id: u64,
        asked: u32,
        held: u32,
    },
    /// Redis did not give a definite answer; the row keeps its intermediate status and is
    /// resumed with the same operation id (HTTP 503; a retry of the request resumes too).
    #[error("redis outcome unknown for reservation {reservation_id} ({status:?}): {reason}")]
    OutcomeUnknown {
        reservation_id: u64,
        status: ReservationStatus,
        reason: String,
    },
    /// Redis lost the bucket (it was built, its key is gone): nothing is sold or moved in
    /// it until it is rebuilt from MySQL and reconciled (HTTP 503 `bucket_lost`).
    #[error("stock bucket {bucket} is lost in Redis; it is refused until rebuilt (stocksvr bucket rebuild)")]
    BucketLost { bucket: String },
    /// MySQL unavailable or failing (HTTP 503).
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    /// Redis and MySQL disagree in a way no legal history explains; the row is left as it
    /// is and alerted, never guessed at (HTTP 500).
    #[error("reservation {reservation_id} is inconsistent: {reason}")]
    Inconsistent { reservation_id: u64, reason: String },
}

impl ServiceError {
    /// Worth retrying later: the dependency may come back.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ServiceError::OutcomeUnknown { .. }
                | ServiceError::Mysql(_)
                | ServiceError::BucketLost { .. }
        )
    }
}

impl ServiceError {
    /// This error in the consumer loop's classes: a request that can never apply is invalid,
    /// an unknown Redis outcome or a MySQL outage is an unavailable dependency (wait, then
    /// the same event applies), and a reservation whose stores disagree waits too: its row
    /// is in the recovery worker's hands, which settles it or marks it dead and alerts.
    pub fn failure(&self) -> stocksvr_pipeline::failure::Failure {
        use stocksvr_pipeline::failure::{Dependency, Failure};
        match self {
            ServiceError::Invalid { .. }
            | ServiceError::OverRefund { .. }
            | ServiceError::NotFound(_)
            | ServiceError::BucketNotFound(_)
            | ServiceError::BucketUnavailable { .. } => Failure::Invalid(self.to_string()),
            ServiceError::OutcomeUnknown { .. } => Failure::unavailable(Dependency::Redis, self),
            ServiceError::Mysql(e) => Failure::from_sqlx(e),
            ServiceError::Inconsistent { .. } | ServiceError::BucketLost { .. } => {
                Failure::unavailable(Dependency::Other, self)
            }
        }
    }
}
