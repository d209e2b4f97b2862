//! The Try API: JSON over HTTP for the order service, documented at `/openapi.json`.
//!
//! Try is idempotent on (order_item_id, dish_id): a repeat returns the first outcome with
//! 200 instead of 201. Bad input is a 400 naming the field; an unknown bucket 404; a closed
//! or disabled bucket 409; Redis or MySQL unavailable 503 with `Retry-After` (fail closed:
//! nothing is sold without a definite answer from Redis).

mod admin;
mod error;
pub mod http_metrics;

pub use admin::admin_router;
pub use error::{ApiError, ErrorBody};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::events::OrderType;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_reservation::view::ReservationView;
use stocksvr_reservation::{ReservationService, TryRequest, REJECTED_ORDER_FAILED};
use stocksvr_store::deadline::Deadline;
use stocksvr_store::reservations::Reservation;
use tokio::sync::OnceCell;
use utoipa::OpenApi;

/// The service appears once Redis and MySQL could be reached at start-up; until then every
/// route answers 503 (fail closed) while health endpoints keep working.
#[derive(Clone, Default)]
pub struct ApiState {
    service: Arc<OnceCell<Arc<ReservationService>>>,
}

impl ApiState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn ready(service: Arc<ReservationService>) -> Self {
        let state = Self::default();
        let _ = state.service.set(service);
        state
    }

    /// Installs the service once it could be built; later calls are ignored.
    pub fn install(&self, service: Arc<ReservationService>) {
        let _ = self.service.set(service);
    }

    fn service(&self) -> Result<&Arc<ReservationService>, ApiError> {
        self.service.get().ok_or_else(|| {
            ApiError::unavailable(
                "the reservation service is starting: Redis or MySQL not reached yet",
            )
        })
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderTypeDto {
    Instant,
    Scheduled,
}

impl From<OrderTypeDto> for OrderType {
    fn from(t: OrderTypeDto) -> Self {
        match t {
            OrderTypeDto::Instant => OrderType::Instant,
            OrderTypeDto::Scheduled => OrderType::Scheduled,
        }
    }
}

/// One dish of one order item.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TryBody {
    pub order_id: u64,
    /// Unique per order line; a repeat of (order_item_id, dish_id) returns the first outcome.
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    /// 1 to the configured maximum (default 999).
    pub quantity: u32,
    pub order_type: OrderTypeDto,
    /// RFC 3339; required for SCHEDULED orders, whose bucket is this instant's business day.
    #[serde(default)]
    pub processing_time: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderItemBody {
    pub order_item_id: u64,
    pub dish_id: u64,
    pub quantity: u32,
}

/// All items of one order, tried concurrently.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderTryBody {
    pub merchant_id: u64,
    pub order_type: OrderTypeDto,
    #[serde(default)]
    pub processing_time: Option<DateTime<Utc>>,
    pub items: Vec<OrderItemBody>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TryResponse {
    /// False when this request repeated an earlier Try.
    pub created: bool,
    pub reservation: ReservationView,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ItemOutcome {
    pub order_item_id: u64,
    pub dish_id: u64,
    /// RESERVED, REJECTED, … or absent when the Try failed with `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<ReservationView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OrderTryResponse {
    pub order_id: u64,
    /// True only when every item is RESERVED. The service never cancels the others by
    /// itself: only OrderCreatedFailed does.
    pub all_reserved: bool,
    pub items: Vec<ItemOutcome>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OrderReservations {
    pub order_id: u64,
    pub reservations: Vec<ReservationView>,
}

#[derive(Debug, Clone, Deserialize, utoipa::IntoParams)]
pub struct StockQuery {
    /// Business day `YYYY-MM-DD`; default: today in UTC.
    pub date: Option<String>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StockNumbersDto {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    /// Redis version (for the snapshot: the version it reflects).
    pub version: u64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StockResponse {
    pub stock_bucket_id: String,
    pub stock_date: String,
    /// The sellable truth, from Redis; absent when the bucket is not in Redis.
    pub redis: Option<StockNumbersDto>,
    /// Bucket state in Redis: OPEN, CLOSED or ARCHIVED.
    pub redis_state: Option<String>,
    /// The MySQL projection built from stock-change events; may lag behind Redis.
    pub snapshot: Option<StockNumbersDto>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "stocksvr Try API",
        description = "Reserve dish stock for orders; read reservations and stock."
    ),
    paths(
        try_reservation,
        try_order,
        get_reservation,
        list_order_reservations,
        get_stock
    ),
    components(schemas(
        TryBody,
        OrderTryBody,
        OrderItemBody,
        OrderTypeDto,
        TryResponse,
        OrderTryResponse,
        ItemOutcome,
        OrderReservations,
        ReservationView,
        StockResponse,
        StockNumbersDto,
        ErrorBody
    ))
)]
pub struct ApiDoc;

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/reservations", post(try_reservation))
        .route("/v1/reservations/{id}", get(get_reservation))
        .route(
            "/v1/orders/{order_id}/reservations",
            post(try_order).get(list_order_reservations),
        )
        .route("/v1/stock/{merchant_id}/{dish_id}", get(get_stock))
        .route("/openapi.json", get(|| async { Json(ApiDoc::openapi()) }))
        .layer(axum::middleware::from_fn(http_metrics::track))
        .with_state(state)
}

fn parse_id(field: &str, raw: &str) -> Result<u64, ApiError> {
    stocksvr_core::ids::parse_id(raw).map_err(|message| ApiError::invalid(field, message))
}

/// A Try whose order failed before it (the order fence, or an OrderCreatedFailed that won
/// the race and cancelled it): a 409, since nothing is held and nothing will be.
fn order_failed(reservation: &Reservation) -> Option<ApiError> {
    let failed = reservation.reject_reason.as_deref() == Some(REJECTED_ORDER_FAILED)
        || matches!(
            reservation.status(),
            Ok(ReservationStatus::Canceling | ReservationStatus::Canceled)
        );
    failed.then(|| {
        ApiError::conflict(
            "order_failed",
            Some("order_id"),
            format!(
                "order {} failed (OrderCreatedFailed) before this Try could hold stock: nothing is held; reservation {} is {}",
                reservation.order_id,
                reservation.id,
                reservation.status_name()
            ),
        )
    })
}

/// Try one dish of one order item.
#[utoipa::path(post, path = "/v1/reservations", request_body = TryBody,
    responses(
        (status = 201, description = "Try ran: RESERVED or REJECTED", body = TryResponse),
        (status = 200, description = "Repeat of an earlier Try: its first outcome", body = TryResponse),
        (status = 400, description = "A field is invalid", body = ErrorBody),
        (status = 404, description = "No stock bucket for this dish and day", body = ErrorBody),
        (status = 409, description = "Stock disabled, bucket closed, or the order failed before this Try (order_failed): nothing is held", body = ErrorBody),
        (status = 503, description = "Redis or MySQL unavailable; retry the same request", body = ErrorBody)))]
async fn try_reservation(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: TryBody = error::parse_json(&body)?;
    let service = state.service()?;
    let reply = service
        .try_reserve(&TryRequest {
            order_id: body.order_id,
            order_item_id: body.order_item_id,
            merchant_id: body.merchant_id,
            dish_id: body.dish_id,
            quantity: body.quantity,
            order_type: body.order_type.into(),
            processing_time: body.processing_time,
        })
        .await?;
    if let Some(refused) = order_failed(&reply.reservation) {
        return Err(refused);
    }
    let status = if reply.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(TryResponse {
            created: reply.created,
            reservation: ReservationView::from_row(&reply.reservation),
        }),
    ))
}

/// Try every item of one order concurrently, one reservation per item.
#[utoipa::path(post, path = "/v1/orders/{order_id}/reservations", request_body = OrderTryBody,
    params(("order_id" = u64, Path, description = "Order id")),
    responses(
        (status = 200, description = "Each item's outcome", body = OrderTryResponse),
        (status = 400, description = "A field is invalid", body = ErrorBody),
        (status = 503, description = "The service is not available", body = ErrorBody)))]
async fn try_order(
    State(state): State<ApiState>,
    Path(order_id): Path<String>,
    body: Bytes,
) -> Result<Json<OrderTryResponse>, ApiError> {
    let order_id = parse_id("order_id", &order_id)?;
    let body: OrderTryBody = error::parse_json(&body)?;
    if body.items.is_empty() || body.items.len() > 100 {
        return Err(ApiError::invalid("items", "must list 1 to 100 items"));
    }
    let mut seen = HashSet::new();
    for (i, item) in body.items.iter().enumerate() {
        if !seen.insert((item.order_item_id, item.dish_id)) {
            return Err(ApiError::invalid(
                format!("items[{i}]"),
                "the same order_item_id and dish_id appear twice",
            ));
        }
    }
    let service = state.service()?;
    let tries = body.items.iter().map(|item| {
        let req = TryRequest {
            order_id,
            order_item_id: item.order_item_id,
            merchant_id: body.merchant_id,
            dish_id: item.dish_id,
            quantity: item.quantity,
            order_type: body.order_type.into(),
            processing_time: body.processing_time,
        };
        async move { (item, service.try_reserve(&req).await) }
    });
    let results = futures::future::join_all(tries).await;
    let items: Vec<ItemOutcome> = results
        .into_iter()
        .map(|(item, result)| match result {
            Ok(reply) if order_failed(&reply.reservation).is_some() => ItemOutcome {
                order_item_id: item.order_item_id,
                dish_id: item.dish_id,
                status: Some(reply.reservation.status_name().to_string()),
                error: order_failed(&reply.reservation).map(|e| e.body),
                reservation: Some(ReservationView::from_row(&reply.reservation)),
            },
            Ok(reply) => ItemOutcome {
                order_item_id: item.order_item_id,
                dish_id: item.dish_id,
                status: Some(reply.reservation.status_name().to_string()),
                reservation: Some(ReservationView::from_row(&reply.reservation)),
                error: None,
            },
            Err(e) => ItemOutcome {
                order_item_id: item.order_item_id,
                dish_id: item.dish_id,
                status: None,
                reservation: None,
                error: Some(ApiError::from(e).body),
            },
        })
        .collect();
    let all_reserved = items
        .iter()
        .all(|i| i.status.as_deref() == Some("RESERVED"));
    Ok(Json(OrderTryResponse {
        order_id,
        all_reserved,
        items,
    }))
}

/// One reservation.
#[utoipa::path(get, path = "/v1/reservations/{id}",
    params(("id" = String, Path, description = "Reservation id")),
    responses((status = 200, body = ReservationView), (status = 404, body = ErrorBody)))]
async fn get_reservation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<ReservationView>, ApiError> {
    let id = parse_id("id", &id)?;
    state
        .service()?
        .get(id)
        .await?
        .map(|row| Json(ReservationView::from_row(&row)))
        .ok_or_else(|| {
            ApiError::not_found(
                "reservation_not_found",
                format!("reservation {id} not found"),
            )
        })
}

/// Every reservation of one order.
#[utoipa::path(get, path = "/v1/orders/{order_id}/reservations",
    params(("order_id" = u64, Path, description = "Order id")),
    responses((status = 200, body = OrderReservations)))]
async fn list_order_reservations(
    State(state): State<ApiState>,
    Path(order_id): Path<String>,
) -> Result<Json<OrderReservations>, ApiError> {
    let order_id = parse_id("order_id", &order_id)?;
    Ok(Json(OrderReservations {
        order_id,
        reservations: state
            .service()?
            .list_order(order_id)
            .await?
            .iter()
            .map(ReservationView::from_row)
            .collect(),
    }))
}

/// A bucket's numbers: Redis (the truth for selling) next to the MySQL snapshot.
#[utoipa::path(get, path = "/v1/stock/{merchant_id}/{dish_id}",
    params(("merchant_id" = u64, Path), ("dish_id" = u64, Path), StockQuery),
    responses((status = 200, body = StockResponse), (status = 400, body = ErrorBody)))]
async fn get_stock(
    State(state): State<ApiState>,
    Path((merchant_id, dish_id)): Path<(String, String)>,
    Query(query): Query<StockQuery>,
) -> Result<Json<StockResponse>, ApiError> {
    let merchant_id = parse_id("merchant_id", &merchant_id)?;
    let dish_id = parse_id("dish_id", &dish_id)?;
    let date = match query.date.as_deref() {
        Some(raw) => NaiveDate::parse_from_str(raw, "%Y-%m-%d")
            .map_err(|e| ApiError::invalid("date", format!("expected YYYY-MM-DD: {e}")))?,
        None => Utc::now().date_naive(),
    };
    let service = state.service()?;
    let key = BucketKey::new(merchant_id, dish_id, date);
    let redis = service
        .lua()
        .read_bucket(&key)
        .await
        .map_err(|e| ApiError::unavailable(format!("redis: {e}")))?;
    let snapshot: Option<(i64, i64, i64, i64, i64, u64)> = sqlx::query_as(
        "SELECT total_stock, available_stock, reserved_stock, sold_stock, deficit_stock, redis_version \
         FROM dish_stock_snapshot WHERE stock_bucket_id = ?",
    )
    .bind(key.stock_bucket_id())
    .fetch_optional(service.pool())
    .deadline()
    .await
    .map_err(|e| ApiError::unavailable(format!("mysql: {e}")))?;
    Ok(Json(StockResponse {
        stock_bucket_id: key.stock_bucket_id(),
        stock_date: date.to_string(),
        redis_state: redis.as_ref().map(|n| n.state.name().to_string()),
        redis: redis.map(|n| StockNumbersDto {
            total: n.total,
            available: n.available,
            reserved: n.reserved,
            sold: n.sold,
            deficit: n.deficit,
            version: n.version,
        }),
        snapshot: snapshot.map(|(total, available, reserved, sold, deficit, version)| {
            StockNumbersDto {
                total,
                available,
                reserved,
                sold,
                deficit,
                version,
            }
        }),
    }))
}
