//! Operator endpoints for stock operations and stuck work (under `/admin`, behind the admin
//! token when one is configured): init, adjust, close and archive a bucket; show a bucket
//! with Redis next to the snapshot; list WAL rows and stuck or dead reservations; retry one
//! now. Every change goes through the same WAL and state machine as the automatic paths.
//!
//! A stock operation answers 200 when it finished, 202 when it is written but not finished
//! (the WAL worker completes it; poll `/admin/operations/{id}`), 409 when it is dead.

use crate::error::{parse_json, ApiError, ErrorBody};
use crate::ApiState;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::NaiveDate;
use serde::Deserialize;
use stocksvr_core::bucket::{self, BucketKey};
use stocksvr_core::codes::StockStatus;
use stocksvr_reservation::operations::WalView;
use stocksvr_reservation::OpsError;
use stocksvr_store::baselines::Baseline;
use stocksvr_store::wal::{Refusal, WalStatus};

pub fn admin_router(state: ApiState) -> Router {
    Router::new()
        .route("/admin/buckets", post(init_bucket))
        .route("/admin/buckets/{bucket_id}", get(show_bucket))
        .route("/admin/buckets/{bucket_id}/adjust", post(adjust_bucket))
        .route("/admin/buckets/{bucket_id}/close", post(close_bucket))
        .route("/admin/buckets/{bucket_id}/archive", post(archive_bucket))
        .route("/admin/buckets/{bucket_id}/rebuild", post(rebuild_bucket))
        .route("/admin/reconcile", get(reconcile))
        .route("/admin/operations", get(list_operations))
        .route("/admin/operations/{operation_id}", get(show_operation))
        .route(
            "/admin/operations/{operation_id}/retry",
            post(retry_operation),
        )
        .route("/admin/reservations/stuck", get(list_stuck))
        .route("/admin/reservations/{id}/retry", post(retry_reservation))
        .with_state(state)
}

impl From<OpsError> for ApiError {
    fn from(e: OpsError) -> Self {
        let message = e.to_string();
        let (status, error, field) = match &e {
            OpsError::Invalid { field, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request",
                Some(field.to_string()),
            ),
            OpsError::Refused(Refusal::NoBaseline(_)) => {
                (StatusCode::NOT_FOUND, "bucket_not_found", None)
            }
            OpsError::Refused(_) => (StatusCode::CONFLICT, "bucket_state", None),
            OpsError::UnknownOperation(_) => (StatusCode::NOT_FOUND, "operation_not_found", None),
            OpsError::Dead { .. } => (StatusCode::CONFLICT, "operation_dead", None),
            OpsError::Pending { .. } => (StatusCode::SERVICE_UNAVAILABLE, "pending", None),
            OpsError::Mysql(_) => (StatusCode::SERVICE_UNAVAILABLE, "mysql_unavailable", None),
            OpsError::Redis(_) => (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable", None),
            OpsError::BucketLost { .. } => (StatusCode::SERVICE_UNAVAILABLE, "bucket_lost", None),
        };
        if status.is_server_error() {
            tracing::warn!(error = %message, "admin request failed");
        }
        ApiError {
            status,
            body: ErrorBody {
                error,
                field,
                message,
            },
        }
    }
}

/// 200 finished, 202 still running or retrying, 409 dead.
fn operation_reply(view: WalView) -> impl IntoResponse {
    let status = match view.status {
        s if s == WalStatus::Succeeded.name() => StatusCode::OK,
        s if s == WalStatus::Dead.name() => StatusCode::CONFLICT,
        _ => StatusCode::ACCEPTED,
    };
    (status, Json(view))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InitBody {
    merchant_id: u64,
    dish_id: u64,
    total: i64,
    /// Business day; default: today in the time zone.
    stock_date: Option<NaiveDate>,
    /// IANA zone; default: the merchant's configured zone (or the service default).
    timezone: Option<String>,
}

async fn init_bucket(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: InitBody = parse_json(&body)?;
    let service = state.service()?;
    for (field, value) in [("merchant_id", body.merchant_id), ("dish_id", body.dish_id)] {
        stocksvr_core::ids::check_id(value).map_err(|e| ApiError::invalid(field, e))?;
    }
    let tz = match &body.timezone {
        Some(name) => bucket::parse_timezone(name)
            .map_err(|e| ApiError::invalid("timezone", e.to_string()))?,
        None => service.timezone(body.merchant_id).await?,
    };
    let date = body
        .stock_date
        .unwrap_or_else(|| bucket::business_date(chrono::Utc::now(), tz));
    let key = BucketKey::new(body.merchant_id, body.dish_id, date);
    let view = service
        .ops()
        .init_bucket(&Baseline {
            stock_bucket_id: key.stock_bucket_id(),
            merchant_id: body.merchant_id,
            dish_id: body.dish_id,
            stock_date: date,
            timezone: tz.name().to_string(),
            total_stock: body.total,
            baseline_version: 1,
            stock_status: StockStatus::Enabled.code(),
            bucket_status: bucket::BucketState::Open.code() as i8,
            lost_at: None,
        })
        .await?;
    Ok(operation_reply(view))
}

fn check_bucket_id(raw: &str) -> Result<(), ApiError> {
    bucket::parse_bucket_id(raw)
        .map(|_| ())
        .map_err(|e| ApiError::invalid("stock_bucket_id", e.to_string()))
}

async fn show_bucket(
    State(state): State<ApiState>,
    Path(bucket_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    check_bucket_id(&bucket_id)?;
    let report = state.service()?.ops().show_bucket(&bucket_id).await?;
    if report.baseline.is_none() && report.redis.is_none() {
        return Err(ApiError::not_found(
            "bucket_not_found",
            format!("no stock bucket {bucket_id}"),
        ));
    }
    Ok(Json(report))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdjustBody {
    total: i64,
}

async fn adjust_bucket(
    State(state): State<ApiState>,
    Path(bucket_id): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    check_bucket_id(&bucket_id)?;
    let body: AdjustBody = parse_json(&body)?;
    let view = state
        .service()?
        .ops()
        .adjust(&bucket_id, body.total)
        .await?;
    Ok(operation_reply(view))
}

async fn close_bucket(
    State(state): State<ApiState>,
    Path(bucket_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    check_bucket_id(&bucket_id)?;
    let view = state.service()?.ops().close(&bucket_id).await?;
    Ok(operation_reply(view))
}

async fn archive_bucket(
    State(state): State<ApiState>,
    Path(bucket_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    check_bucket_id(&bucket_id)?;
    let view = state.service()?.ops().archive(&bucket_id).await?;
    Ok(operation_reply(view))
}

/// Rebuilds a bucket Redis lost from MySQL, then reopens it once a pass finds it clean:
/// 200 rebuilt and reopened, 202 rebuilt (or still running) but not reopened yet.
async fn rebuild_bucket(
    State(state): State<ApiState>,
    Path(bucket_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    check_bucket_id(&bucket_id)?;
    let (view, reopened) = state
        .reconciler()?
        .rebuild(&bucket_id)
        .await
        .map_err(reconcile_error)?;
    let status = if view.status == WalStatus::Dead.name() {
        StatusCode::CONFLICT
    } else if reopened {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(serde_json::json!({ "operation": view, "reopened": reopened })),
    ))
}

fn reconcile_error(e: stocksvr_reconciler::ReconcileError) -> ApiError {
    use stocksvr_reconciler::ReconcileError as E;
    match e {
        E::Ops(e) => e.into(),
        E::Service(e) => e.into(),
        E::Mysql(e) => OpsError::Mysql(e).into(),
        E::Redis(e) => OpsError::Redis(e).into(),
        // Only a scheduled pass stops with the process; kept total for the compiler.
        E::Stopped => ApiError::unavailable("the service is stopping"),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileQuery {
    bucket: Option<String>,
    merchant_id: Option<u64>,
    date: Option<NaiveDate>,
}

/// The on-demand check (two passes a few seconds apart), read only: every matching bucket's
/// three views, its verdict and the differences both passes saw.
async fn reconcile(
    State(state): State<ApiState>,
    query: Result<Query<ReconcileQuery>, QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Query(q) = query.map_err(query_error)?;
    if let Some(bucket) = &q.bucket {
        check_bucket_id(bucket)?;
    }
    if let Some(m) = q.merchant_id {
        stocksvr_core::ids::check_id(m).map_err(|e| ApiError::invalid("merchant_id", e))?;
    }
    let filter = stocksvr_reconciler::BucketFilter {
        bucket: q.bucket,
        merchant_id: q.merchant_id,
        stock_date: q.date,
        shard: None,
    };
    let checked = state
        .reconciler()?
        .check(&filter, false, &|_| {})
        .await
        .map_err(reconcile_error)?;
    let differences = checked.iter().filter(|c| !c.confirmed.is_empty()).count();
    Ok(Json(serde_json::json!({
        "buckets": checked,
        "differences": differences,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationsQuery {
    /// Comma-separated statuses (INIT, EXECUTING, SUCCEEDED, RETRY, DEAD); default: all but
    /// SUCCEEDED.
    status: Option<String>,
    bucket: Option<String>,
    limit: Option<u32>,
}

/// A query string that does not parse (`?limit=abc`, an unknown parameter) is a 400 with the
/// JSON body every other error has; serde names the parameter in the message.
fn query_error(e: QueryRejection) -> ApiError {
    ApiError::invalid("query", e.body_text())
}

fn limit(raw: Option<u32>) -> Result<u32, ApiError> {
    match raw.unwrap_or(100) {
        n @ 1..=1000 => Ok(n),
        n => Err(ApiError::invalid(
            "limit",
            format!("must be between 1 and 1000, got {n}"),
        )),
    }
}

async fn list_operations(
    State(state): State<ApiState>,
    q: Result<Query<OperationsQuery>, QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Query(q) = q.map_err(query_error)?;
    let statuses = match q.status.as_deref() {
        None => vec![
            WalStatus::Init,
            WalStatus::Executing,
            WalStatus::Retry,
            WalStatus::Dead,
        ],
        Some(list) => list
            .split(',')
            .map(|s| {
                WalStatus::parse(s.trim()).ok_or_else(|| {
                    ApiError::invalid(
                        "status",
                        format!("unknown status {s:?}: INIT, EXECUTING, SUCCEEDED, RETRY or DEAD"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
    };
    if let Some(b) = &q.bucket {
        check_bucket_id(b)?;
    }
    let rows = state
        .service()?
        .ops()
        .list(&statuses, q.bucket.as_deref(), limit(q.limit)?)
        .await?;
    Ok(Json(rows))
}

async fn show_operation(
    State(state): State<ApiState>,
    Path(operation_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service()?.ops().find(&operation_id).await?))
}

async fn retry_operation(
    State(state): State<ApiState>,
    Path(operation_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let view = state.service()?.ops().retry_now(&operation_id).await?;
    Ok(operation_reply(view))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StuckQuery {
    /// Only reservations recovery gave up on.
    dead_only: Option<bool>,
    limit: Option<u32>,
}

async fn list_stuck(
    State(state): State<ApiState>,
    q: Result<Query<StuckQuery>, QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Query(q) = q.map_err(query_error)?;
    let rows = state
        .service()?
        .list_stuck(q.dead_only.unwrap_or(false), limit(q.limit)?)
        .await?;
    Ok(Json(rows))
}

async fn retry_reservation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let id = crate::parse_id("id", &id)?;
    Ok(Json(state.service()?.retry_now(id).await?))
}
