//! The Try API: JSON over HTTP for the order service, documented at `/openapi.json`.
//!
//! Try is idempotent on (order_item_id, dish_id): a repeat returns the first outcome with
//! 200 instead of 201. Bad input is a 400 naming the field; an unknown bucket 404; a closed
//! or disabled bucket 409; Redis or MySQL unavailable 503 with `Retry-After` (fail closed:
//! nothing is sold without a definite answer from Redis).

mod admin;
pub mod auth;
mod dto;
mod error;
pub mod http_metrics;
mod openapi;
mod request;
pub mod shed;
#[cfg(test)]
mod test_client;

pub use admin::admin_router;
pub use dto::{
    ItemOutcome, OrderItemBody, OrderReservations, OrderTryBody, OrderTryResponse, OrderTypeDto,
    StockNumbersDto, StockQuery, StockResponse, TryBody, TryResponse, EXAMPLE_DISH_ID,
    EXAMPLE_MERCHANT_ID,
};
pub use error::{ApiError, ErrorBody};
pub use openapi::{openapi_json, ApiDoc};

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{NaiveDate, Utc};
use std::collections::HashSet;
use std::sync::Arc;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_reservation::view::ReservationView;
use stocksvr_reservation::{ReservationService, TryRequest, REJECTED_ORDER_FAILED};
use stocksvr_store::deadline::Deadline;
use stocksvr_store::reservations::Reservation;
use tokio::sync::OnceCell;

/// The service appears once Redis and MySQL could be reached at start-up; until then every
/// route answers 503 (fail closed) while health endpoints keep working.
#[derive(Clone, Default)]
pub struct ApiState {
    service: Arc<OnceCell<Arc<ReservationService>>>,
    /// For `/admin/reconcile` and `/admin/buckets/{id}/rebuild`.
    reconcile: Arc<stocksvr_reconciler::ReconcileConfig>,
    /// The in-flight bound and admission queue of the `/v1` routes.
    admission: shed::Admission,
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

    /// Whether the service is installed: the Try API answers instead of "starting".
    pub fn is_serving(&self) -> bool {
        self.service.get().is_some()
    }

    /// Installs the service once it could be built; later calls are ignored.
    pub fn install(&self, service: Arc<ReservationService>) {
        let _ = self.service.set(service);
    }

    /// The reconciler settings the admin endpoints use (the `[reconcile]` section).
    pub fn with_reconcile_config(mut self, config: stocksvr_reconciler::ReconcileConfig) -> Self {
        self.reconcile = Arc::new(config);
        self
    }

    /// The load-shedding bounds of the `/v1` routes (the `[http]` settings).
    pub fn with_shed_config(mut self, config: shed::ShedConfig) -> Self {
        self.admission = shed::Admission::new(config);
        self
    }

    fn reconciler(&self) -> Result<stocksvr_reconciler::Reconciler, ApiError> {
        Ok(stocksvr_reconciler::Reconciler::new(
            self.service()?.clone(),
            (*self.reconcile).clone(),
        ))
    }

    fn service(&self) -> Result<&Arc<ReservationService>, ApiError> {
        self.service.get().ok_or_else(|| {
            ApiError::unavailable(
                "the reservation service is starting: Redis or MySQL not reached yet",
            )
        })
    }
}

pub fn router(state: ApiState) -> Router {
    let admission = state.admission.clone();
    Router::new()
        .route("/v1/reservations", post(try_reservation))
        .route("/v1/reservations/{id}", get(get_reservation))
        .route(
            "/v1/orders/{order_id}/reservations",
            post(try_order).get(list_order_reservations),
        )
        .route("/v1/stock/{merchant_id}/{dish_id}", get(get_stock))
        .route("/openapi.json", get(|| async { Json(openapi_json()) }))
        // Inside the metrics layer: a shed request is timed and counted like any other.
        .layer(axum::middleware::from_fn_with_state(admission, shed::admit))
        .layer(axum::middleware::from_fn(http_metrics::track))
        .with_state(state)
}

fn parse_id(field: &str, raw: &str) -> Result<u64, ApiError> {
    stocksvr_core::ids::parse_id(raw).map_err(|message| ApiError::invalid(field, message))
}

/// An id path segment; a segment axum cannot even decode (bad percent-encoding) is the same
/// JSON 400 naming the parameter, not axum's plain-text rejection.
fn path_id(field: &str, raw: Result<Path<String>, PathRejection>) -> Result<u64, ApiError> {
    let Path(raw) = raw.map_err(|e| ApiError::invalid(field, e.body_text()))?;
    parse_id(field, &raw)
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
        (status = 201, description = "Try ran: RESERVED or REJECTED", body = TryResponse, links(
            ("GetReservation" = (operation_id = "get_reservation",
                parameters(("id" = "$response.body#/reservation/reservation_id")))),
            ("OrderReservations" = (operation_id = "list_order_reservations",
                parameters(("order_id" = "$request.body#/order_id")))),
            ("Stock" = (operation_id = "get_stock", parameters(
                ("merchant_id" = "$request.body#/merchant_id"),
                ("dish_id" = "$request.body#/dish_id")))))),
        (status = 200, description = "Repeat of an earlier Try: its first outcome", body = TryResponse, links(
            ("GetReservation" = (operation_id = "get_reservation",
                parameters(("id" = "$response.body#/reservation/reservation_id")))))),
        (status = 400, description = "A field is invalid", body = ErrorBody),
        (status = 404, description = "No stock bucket for this dish and day", body = ErrorBody),
        (status = 409, description = "Stock disabled or bucket closed (bucket_unavailable), the order failed before this Try (order_failed: nothing is held), or this (order_item_id, dish_id) is already reserved with another order, merchant or quantity (order_item_conflict)", body = ErrorBody),
        (status = 503, description = "Redis or MySQL unavailable; retry the same request", body = ErrorBody)))]
async fn try_reservation(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: TryBody = error::parse_json(&body)?;
    let service = state.service()?;
    let req = TryRequest {
        order_id: body.order_id,
        order_item_id: body.order_item_id,
        merchant_id: body.merchant_id,
        dish_id: body.dish_id,
        quantity: body.quantity,
        order_type: body.order_type.into(),
        processing_time: body.processing_time,
    };
    request::check_try(&req, service.config().max_quantity, str::to_string)?;
    let reply = service
        .try_reserve(&req)
        .await
        .map_err(request::try_error)?;
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
    params(("order_id" = u64, Path, description = "Order id", minimum = 1, maximum = 9223372036854775807_i64)),
    responses(
        (status = 200, description = "Each item's outcome; an item's own failure is in its `error`", body = OrderTryResponse, links(
            ("OrderReservations" = (operation_id = "list_order_reservations",
                parameters(("order_id" = "$request.path.order_id")))))),
        (status = 400, description = "A field is invalid", body = ErrorBody),
        (status = 503, description = "The service is not available", body = ErrorBody)))]
async fn try_order(
    State(state): State<ApiState>,
    order_id: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Json<OrderTryResponse>, ApiError> {
    let order_id = path_id("order_id", order_id)?;
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
    let requests: Vec<(&OrderItemBody, TryRequest)> = body
        .items
        .iter()
        .map(|item| {
            let req = TryRequest {
                order_id,
                order_item_id: item.order_item_id,
                merchant_id: body.merchant_id,
                dish_id: item.dish_id,
                quantity: item.quantity,
                order_type: body.order_type.into(),
                processing_time: body.processing_time,
            };
            (item, req)
        })
        .collect();
    // Every item is checked before any is tried: a malformed order holds nothing.
    for (i, (_, req)) in requests.iter().enumerate() {
        request::check_try(req, service.config().max_quantity, |field| match field {
            "order_item_id" | "dish_id" | "quantity" => format!("items[{i}].{field}"),
            order_level => order_level.to_string(),
        })?;
    }
    let tries = requests
        .iter()
        .map(|(item, req)| async move { (*item, service.try_reserve(req).await) });
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
                error: Some(request::try_error(e).body),
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
    params(("id" = u64, Path, description = "Reservation id (the string `reservation_id` of a Try's answer)",
        minimum = 1, maximum = 9223372036854775807_i64)),
    responses(
        (status = 200, description = "The reservation", body = ReservationView),
        (status = 400, description = "The id is not a valid id", body = ErrorBody),
        (status = 404, description = "No such reservation", body = ErrorBody),
        (status = 503, description = "MySQL unavailable; retry", body = ErrorBody)))]
async fn get_reservation(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ReservationView>, ApiError> {
    let id = path_id("id", id)?;
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
    params(("order_id" = u64, Path, description = "Order id", minimum = 1, maximum = 9223372036854775807_i64)),
    responses(
        (status = 200, description = "The order's reservations (none is an empty list)", body = OrderReservations),
        (status = 400, description = "The id is not a valid id", body = ErrorBody),
        (status = 503, description = "MySQL unavailable; retry", body = ErrorBody)))]
async fn list_order_reservations(
    State(state): State<ApiState>,
    order_id: Result<Path<String>, PathRejection>,
) -> Result<Json<OrderReservations>, ApiError> {
    let order_id = path_id("order_id", order_id)?;
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
    params(
        ("merchant_id" = u64, Path, minimum = 1, maximum = 9223372036854775807_i64),
        ("dish_id" = u64, Path, minimum = 1, maximum = 9223372036854775807_i64),
        StockQuery),
    responses(
        (status = 200, description = "Redis and snapshot numbers; each absent when unknown", body = StockResponse),
        (status = 400, description = "A parameter is invalid", body = ErrorBody),
        (status = 503, description = "Redis or MySQL unavailable; retry", body = ErrorBody)))]
async fn get_stock(
    State(state): State<ApiState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<StockQuery>, QueryRejection>,
) -> Result<Json<StockResponse>, ApiError> {
    let Path((merchant_id, dish_id)) =
        ids.map_err(|e| ApiError::invalid("merchant_id", e.body_text()))?;
    let merchant_id = parse_id("merchant_id", &merchant_id)?;
    let dish_id = parse_id("dish_id", &dish_id)?;
    // `?date=a&date=b` and other query strings serde refuses: the same JSON 400 as any
    // other bad field (axum's own rejection is plain text).
    let Query(query) = query.map_err(|e| ApiError::invalid("date", e.body_text()))?;
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
