//! `/admin/dlq`: the admin API over parked dead letters. Every answer is JSON, errors as
//! `{"error", "message"}` like the rest of the API; the caller wraps the routes with the
//! admin bearer-token check.

use crate::preview::{as_text, hex};
use crate::replay::replay;
use crate::store::{self, DlqError, Filter, Parked, ParkedSummary, Status};
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::MySqlPool;
use std::sync::Arc;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::json::avro_to_json;
use stocksvr_pipeline::producer::Producer;
use tokio::sync::OnceCell;

#[derive(Clone)]
pub struct AdminState {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    producer: OnceCell<Producer>,
    /// Where a replay producer comes from when none was given.
    kafka: Option<KafkaSettings>,
    codec: Option<AvroCodec>,
}

impl AdminState {
    /// `producer` should come from [`crate::replay_producer`] (bounded delivery time).
    /// Without `codec`, `GET /admin/dlq/{id}` shows bytes only.
    pub fn new(pool: MySqlPool, producer: Producer, codec: Option<AvroCodec>) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                producer: OnceCell::new_with(Some(producer)),
                kafka: None,
                codec,
            }),
        }
    }

    /// The replay producer is made on the first replay: a librdkafka producer's polling
    /// thread costs CPU every second of its life, and most processes never replay.
    pub fn with_lazy_producer(
        pool: MySqlPool,
        kafka: KafkaSettings,
        codec: Option<AvroCodec>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                producer: OnceCell::new(),
                kafka: Some(kafka),
                codec,
            }),
        }
    }

    async fn producer(&self) -> Result<&Producer, DlqError> {
        self.inner
            .producer
            .get_or_try_init(|| async {
                match &self.inner.kafka {
                    Some(kafka) => crate::replay_producer(kafka).map_err(DlqError::Kafka),
                    None => Err(DlqError::Kafka(rdkafka::error::KafkaError::ClientCreation(
                        "no replay producer".into(),
                    ))),
                }
            })
            .await
    }
}

/// `GET /admin/dlq`, `GET /admin/dlq/{id}`, `POST /admin/dlq/{id}/replay`,
/// `POST /admin/dlq/{id}/discard`.
pub fn admin_routes(state: AdminState) -> Router {
    Router::new()
        .route("/admin/dlq", get(list))
        .route("/admin/dlq/{id}", get(show))
        .route("/admin/dlq/{id}/replay", post(replay_one))
        .route("/admin/dlq/{id}/discard", post(discard_one))
        .with_state(state)
}

struct ApiError {
    status: StatusCode,
    error: &'static str,
    message: String,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error: "invalid_request",
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.error, "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

impl From<DlqError> for ApiError {
    fn from(e: DlqError) -> Self {
        let (status, error) = match &e {
            DlqError::NotFound(_) => (StatusCode::NOT_FOUND, "dead_letter_not_found"),
            DlqError::ReplayRefused { .. } => (StatusCode::CONFLICT, "already_resolved"),
            DlqError::DiscardRefused { .. } => (StatusCode::CONFLICT, "already_replayed"),
            DlqError::NotReplayable { .. } => (StatusCode::CONFLICT, "not_replayable"),
            DlqError::Database(_) => (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable"),
            DlqError::Kafka(_) => (StatusCode::SERVICE_UNAVAILABLE, "kafka_unavailable"),
            // The record is on its topic; the operator must know before replaying again.
            DlqError::NotMarked { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "replayed_not_marked")
            }
            DlqError::UnknownStatus { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "unknown_status"),
        };
        if status.is_server_error() {
            tracing::warn!(error = %e, "dead-letter admin request failed");
        }
        Self {
            status,
            error,
            message: e.to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// parked (default), replayed, discarded or all.
    status: Option<String>,
    topic: Option<String>,
    limit: Option<u32>,
    after_id: Option<u64>,
}

#[derive(Serialize)]
struct ListBody {
    dead_letters: Vec<ParkedSummary>,
    /// Pass as `after_id` for the next page; absent on the last page.
    next_after_id: Option<u64>,
}

async fn list(
    State(state): State<AdminState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ListBody>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let status = match q.status.as_deref() {
        None => Some(Status::Parked),
        Some("all") => None,
        Some(s) => Some(s.parse::<Status>().map_err(ApiError::bad_request)?),
    };
    let filter = Filter {
        status,
        original_topic: q.topic.filter(|t| !t.is_empty()),
        limit: q.limit.unwrap_or(50),
        after_id: q.after_id,
    };
    let rows = store::list(&state.inner.pool, &filter).await?;
    let full_page = rows.len() as u32 == filter.limit.clamp(1, store::MAX_LIST_LIMIT);
    let next_after_id = rows.last().map(|r| r.id).filter(|_| full_page);
    Ok(Json(ListBody {
        dead_letters: rows,
        next_after_id,
    }))
}

#[derive(Serialize)]
struct BytesView {
    len: usize,
    hex: String,
    /// Present when the bytes are harmless UTF-8 text.
    #[serde(skip_serializing_if = "Option::is_none")]
    utf8: Option<String>,
}

impl BytesView {
    fn of(bytes: Option<&[u8]>) -> Option<Self> {
        bytes.map(|b| BytesView {
            len: b.len(),
            hex: hex(b),
            utf8: as_text(b).map(str::to_string),
        })
    }
}

#[derive(Serialize)]
struct ShowBody {
    #[serde(flatten)]
    summary: ParkedSummary,
    original_timestamp_ms: Option<i64>,
    consumer_group: String,
    key: Option<BytesView>,
    value: Option<BytesView>,
    /// `{"full_name", "schema_id", "value"}` when the registry knows the schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    decoded: Option<serde_json::Value>,
    /// Why the value could not be decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    decode_error: Option<String>,
}

async fn show(
    State(state): State<AdminState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<ShowBody>, ApiError> {
    let id = path_id(id)?;
    let parked: Parked = store::show(&state.inner.pool, id)
        .await?
        .ok_or(DlqError::NotFound(id))?;
    let (decoded, decode_error) = match &state.inner.codec {
        None => (None, Some("no schema registry configured".to_string())),
        Some(codec) => match codec.decode(parked.value.as_deref()).await {
            Ok(d) => (
                Some(json!({
                    "full_name": d.full_name,
                    "schema_id": d.schema_id,
                    "value": avro_to_json(&d.value),
                })),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    Ok(Json(ShowBody {
        key: BytesView::of(parked.key.as_deref()),
        value: BytesView::of(parked.value.as_deref()),
        summary: parked.summary,
        original_timestamp_ms: parked.original_timestamp_ms,
        consumer_group: parked.consumer_group,
        decoded,
        decode_error,
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    #[serde(default)]
    force: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiscardRequest {
    reason: String,
}

fn path_id(id: Result<Path<u64>, PathRejection>) -> Result<u64, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|_| ApiError::bad_request("the id in the path must be a positive integer"))
}

/// Parses a JSON body, naming what was wrong in a JSON 400 (axum's own rejection is text).
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("body: {e}")))
}

async fn replay_one(
    State(state): State<AdminState>,
    id: Result<Path<u64>, PathRejection>,
    body: Bytes,
) -> Result<Json<crate::ReplayOutcome>, ApiError> {
    let id = path_id(id)?;
    // The body is optional: an empty one is a plain replay.
    let request: ReplayRequest = if body.iter().all(u8::is_ascii_whitespace) {
        ReplayRequest::default()
    } else {
        parse_body(&body)?
    };
    let producer = state.producer().await?;
    let done = replay(&state.inner.pool, producer, id, request.force).await?;
    Ok(Json(done))
}

async fn discard_one(
    State(state): State<AdminState>,
    id: Result<Path<u64>, PathRejection>,
    body: Bytes,
) -> Result<Json<crate::DiscardOutcome>, ApiError> {
    let id = path_id(id)?;
    let request: DiscardRequest = parse_body(&body)?;
    if request.reason.trim().is_empty() {
        return Err(ApiError::bad_request("reason must not be empty"));
    }
    Ok(Json(
        store::discard(&state.inner.pool, id, &request.reason).await?,
    ))
}
