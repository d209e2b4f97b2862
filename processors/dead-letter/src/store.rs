//! Reading and resolving parked dead letters: list, show, discard. (Replay, which also
//! talks to Kafka, is in `replay.rs`.)

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use sqlx::{MySql, MySqlPool, QueryBuilder};
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::OneOff;
use stocksvr_telemetry::names;

/// Upper bound of one `list` page, so one request cannot pull the whole table.
pub const MAX_LIST_LIMIT: u32 = 1000;

pub use stocksvr_core::codes::DeadLetterStatus as Status;

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("dead letter {0} does not exist")]
    NotFound(u64),
    #[error("dead letter {id} is {status} already; replay it again only with force")]
    ReplayRefused { id: u64, status: Status },
    #[error("dead letter {id} is {status}; only a parked dead letter can be discarded")]
    DiscardRefused { id: u64, status: Status },
    #[error("dead letter {id} cannot be replayed: {reason}")]
    NotReplayable { id: u64, reason: String },
    #[error("dead letter {id} was produced to {topic}/{partition}@{offset} but is not marked replayed: {source}")]
    NotMarked {
        id: u64,
        topic: String,
        partition: i32,
        offset: i64,
        source: sqlx::Error,
    },
    #[error("dead letter {id} has unknown status code {code}")]
    UnknownStatus { id: u64, code: i8 },
    #[error("mysql: {0}")]
    Database(#[from] sqlx::Error),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

/// What `list` selects. The default is the first page of parked dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// `None`: every status.
    pub status: Option<Status>,
    pub original_topic: Option<String>,
    /// Page size, capped at [`MAX_LIST_LIMIT`].
    pub limit: u32,
    /// Only ids above this one (keyset paging: pass the last id of the previous page).
    pub after_id: Option<u64>,
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            status: Some(Status::Parked),
            original_topic: None,
            limit: 50,
            after_id: None,
        }
    }
}

/// One line of `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParkedSummary {
    pub id: u64,
    pub status: Status,
    pub dlt_topic: String,
    pub dlt_partition: i32,
    pub dlt_offset: i64,
    pub original_topic: String,
    pub original_partition: i32,
    /// -1 when the dead letter did not say.
    pub original_offset: i64,
    pub error_class: String,
    pub error_message: String,
    /// When it was parked.
    pub created_at: DateTime<Utc>,
    /// When it was last replayed or discarded (its parking time while parked).
    pub updated_at: DateTime<Utc>,
}

/// Everything parked about one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    pub summary: ParkedSummary,
    pub original_timestamp_ms: Option<i64>,
    pub consumer_group: String,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

#[derive(sqlx::FromRow)]
struct SummaryRow {
    id: u64,
    status: i8,
    dlt_topic: String,
    dlt_partition: i32,
    dlt_offset: i64,
    original_topic: String,
    original_partition: i32,
    original_offset: i64,
    error_class: String,
    error_message: String,
    created_at: NaiveDateTime,
    updated_at: NaiveDateTime,
}

impl TryFrom<SummaryRow> for ParkedSummary {
    type Error = DlqError;
    fn try_from(r: SummaryRow) -> Result<Self, DlqError> {
        let status = Status::from_code(r.status).ok_or(DlqError::UnknownStatus {
            id: r.id,
            code: r.status,
        })?;
        Ok(ParkedSummary {
            id: r.id,
            status,
            dlt_topic: r.dlt_topic,
            dlt_partition: r.dlt_partition,
            dlt_offset: r.dlt_offset,
            original_topic: r.original_topic,
            original_partition: r.original_partition,
            original_offset: r.original_offset,
            error_class: r.error_class,
            error_message: r.error_message,
            created_at: r.created_at.and_utc(),
            updated_at: r.updated_at.and_utc(),
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct FullRow {
    #[sqlx(flatten)]
    summary: SummaryRow,
    original_timestamp_ms: Option<i64>,
    consumer_group: String,
    record_key: Option<Vec<u8>>,
    record_value: Option<Vec<u8>>,
}

impl TryFrom<FullRow> for Parked {
    type Error = DlqError;
    fn try_from(r: FullRow) -> Result<Self, DlqError> {
        Ok(Parked {
            summary: r.summary.try_into()?,
            original_timestamp_ms: r.original_timestamp_ms,
            consumer_group: r.consumer_group,
            key: r.record_key,
            value: r.record_value,
        })
    }
}

const SUMMARY_COLUMNS: &str = "id, status, dlt_topic, dlt_partition, dlt_offset, original_topic, \
     original_partition, original_offset, error_class, error_message, created_at, updated_at";

pub(crate) fn full_select() -> String {
    format!(
        "SELECT {SUMMARY_COLUMNS}, original_timestamp_ms, consumer_group, record_key, \
         record_value FROM inventory_dead_letter WHERE id = ?"
    )
}

/// One page of dead letters matching `filter`, oldest first.
pub async fn list(pool: &MySqlPool, filter: &Filter) -> Result<Vec<ParkedSummary>, DlqError> {
    let mut q: QueryBuilder<MySql> = QueryBuilder::new(format!(
        "SELECT {SUMMARY_COLUMNS} FROM inventory_dead_letter WHERE id > "
    ));
    q.push_bind(filter.after_id.unwrap_or(0));
    if let Some(status) = filter.status {
        q.push(" AND status = ").push_bind(status.code());
    }
    if let Some(topic) = &filter.original_topic {
        q.push(" AND original_topic = ").push_bind(topic.clone());
    }
    q.push(" ORDER BY id LIMIT ")
        .push_bind(filter.limit.clamp(1, MAX_LIST_LIMIT));
    let rows: Vec<SummaryRow> = q.one_off_as().fetch_all(pool).deadline().await?;
    rows.into_iter().map(ParkedSummary::try_from).collect()
}

/// The dead letter `id`, or `None`.
pub async fn show(pool: &MySqlPool, id: u64) -> Result<Option<Parked>, DlqError> {
    let row: Option<FullRow> = sqlx::query_as(&full_select())
        .bind(id)
        .fetch_optional(pool)
        .deadline()
        .await?;
    row.map(Parked::try_from).transpose()
}

/// How a discard ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscardOutcome {
    pub id: u64,
    /// False when it was discarded before: a repeated discard changes nothing.
    pub changed: bool,
}

/// Marks a parked dead letter discarded: the operator decided it is never to be applied.
/// Discarding twice is a no-op; a replayed dead letter cannot be discarded (its record is
/// back on its topic, so the row must keep saying so).
pub async fn discard(pool: &MySqlPool, id: u64, reason: &str) -> Result<DiscardOutcome, DlqError> {
    let now = Utc::now().naive_utc();
    let updated = sqlx::query(
        "UPDATE inventory_dead_letter SET status = ?, updated_at = ? WHERE id = ? AND status = ?",
    )
    .bind(Status::Discarded.code())
    .bind(now)
    .bind(id)
    .bind(Status::Parked.code())
    .execute(pool)
    .deadline()
    .await?;
    if updated.rows_affected() == 1 {
        metrics::counter!(names::DEAD_LETTERS_DISCARDED).increment(1);
        // The table has no column for the reason yet: the log is its record.
        tracing::info!(id, reason, "dead letter discarded");
        return Ok(DiscardOutcome { id, changed: true });
    }
    // The CAS missed: say why from the row as it is now.
    let status: Option<(i8,)> =
        sqlx::query_as("SELECT status FROM inventory_dead_letter WHERE id = ?")
            .bind(id)
            .fetch_optional(pool)
            .deadline()
            .await?;
    match status.map(|(code,)| (code, Status::from_code(code))) {
        None => Err(DlqError::NotFound(id)),
        Some((_, Some(Status::Discarded))) => Ok(DiscardOutcome { id, changed: false }),
        Some((_, Some(status))) => Err(DlqError::DiscardRefused { id, status }),
        Some((code, None)) => Err(DlqError::UnknownStatus { id, code }),
    }
}
