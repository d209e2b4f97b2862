//! The Try API's request and response bodies, as the OpenAPI document shows them (with
//! the examples its fuzz test builds requests on).

use crate::error::ErrorBody;
use crate::request;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use stocksvr_core::events::OrderType;
use stocksvr_reservation::view::ReservationView;

/// The merchant of the document's request examples (the OpenAPI fuzz test creates its
/// bucket, so generated requests built on the examples reach the success paths).
pub const EXAMPLE_MERCHANT_ID: u64 = 10001;
/// The dish of the document's request examples.
pub const EXAMPLE_DISH_ID: u64 = 20001;

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
#[schema(example = json!({"order_id": 90000001, "order_item_id": 1, "merchant_id": EXAMPLE_MERCHANT_ID,
    "dish_id": EXAMPLE_DISH_ID, "quantity": 1, "order_type": "INSTANT"}))]
pub struct TryBody {
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub order_id: u64,
    /// Unique per order line; a repeat of (order_item_id, dish_id) returns the first outcome.
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub order_item_id: u64,
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub merchant_id: u64,
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub dish_id: u64,
    /// 1 to the configured maximum (`reservation.max_quantity`, default 999).
    #[schema(minimum = 1, maximum = 999)]
    #[serde(deserialize_with = "request::u32_integer")]
    pub quantity: u32,
    pub order_type: OrderTypeDto,
    /// RFC 3339; required for SCHEDULED orders, whose bucket is this instant's business day.
    #[serde(default)]
    pub processing_time: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderItemBody {
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub order_item_id: u64,
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub dish_id: u64,
    /// 1 to the configured maximum (`reservation.max_quantity`, default 999).
    #[schema(minimum = 1, maximum = 999)]
    #[serde(deserialize_with = "request::u32_integer")]
    pub quantity: u32,
}

/// All items of one order, tried concurrently.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"merchant_id": EXAMPLE_MERCHANT_ID, "order_type": "INSTANT",
    "items": [{"order_item_id": 1, "dish_id": EXAMPLE_DISH_ID, "quantity": 2}]}))]
pub struct OrderTryBody {
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "request::u64_integer")]
    pub merchant_id: u64,
    pub order_type: OrderTypeDto,
    /// RFC 3339; required for SCHEDULED orders.
    #[serde(default)]
    pub processing_time: Option<DateTime<Utc>>,
    /// 1 to 100 items, no (order_item_id, dish_id) twice.
    #[schema(min_items = 1, max_items = 100)]
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
#[into_params(parameter_in = Query)]
pub struct StockQuery {
    /// Business day `YYYY-MM-DD`; default: today in UTC.
    #[param(format = Date)]
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
