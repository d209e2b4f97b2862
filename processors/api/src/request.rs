//! What a request must be before the service sees it: JSON integers as JSON Schema reads
//! them, and the Try rules checked for a whole order at once, each failure naming its field.

use crate::error::ApiError;
use serde::{Deserialize, Deserializer};
use stocksvr_core::events::OrderType;
use stocksvr_reservation::{ServiceError, TryRequest};

/// Below 2^53 every integer has an exact `f64`, so `12.0` can only mean 12.
const EXACT_F64: f64 = 9_007_199_254_740_992.0;

/// An integer as JSON Schema's `integer` reads it: `12` and `12.0` are the same value (the
/// document says `type: integer`, and some JSON writers print whole doubles with `.0`). A
/// fraction, or a float at or beyond 2^53 (where it may stand for a neighbouring integer:
/// an id must never silently become another), is refused.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonInteger {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
}

fn integer<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    use serde::de::Error;
    match JsonInteger::deserialize(deserializer) {
        Ok(JsonInteger::Unsigned(v)) => Ok(v),
        Ok(JsonInteger::Signed(v)) => {
            Err(D::Error::custom(format!("must not be negative, got {v}")))
        }
        Ok(JsonInteger::Float(f)) if f.fract() == 0.0 && (0.0..EXACT_F64).contains(&f) => {
            Ok(f as u64)
        }
        Ok(JsonInteger::Float(f)) => Err(D::Error::custom(format!(
            "must be a whole number below 2^53 when written with a decimal point, got {f}"
        ))),
        Err(_) => Err(D::Error::custom("must be a non-negative integer")),
    }
}

/// `#[serde(deserialize_with)]` for an id (range checked by [`check_try`]).
pub fn u64_integer<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    integer(deserializer)
}

/// `#[serde(deserialize_with)]` for a quantity.
pub fn u32_integer<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    use serde::de::Error;
    let v = integer(deserializer)?;
    u32::try_from(v).map_err(|_| D::Error::custom(format!("must be at most {}, got {v}", u32::MAX)))
}

/// The service's own Try rules (ids within an Avro long, quantity within
/// `reservation.max_quantity`, a processing time for SCHEDULED orders), checked before any
/// Try runs, so a bad item fails the whole request with a 400 naming the field as the
/// request spells it (`field_name` maps `quantity` to `items[2].quantity` for an order). A
/// service error naming `order_item_id` after this check can then only mean an item already
/// reserved with other data (see [`try_error`]).
pub fn check_try(
    req: &TryRequest,
    max_quantity: u32,
    field_name: impl Fn(&str) -> String,
) -> Result<(), ApiError> {
    for (name, value) in [
        ("order_id", req.order_id),
        ("merchant_id", req.merchant_id),
        ("order_item_id", req.order_item_id),
        ("dish_id", req.dish_id),
    ] {
        stocksvr_core::ids::check_id(value).map_err(|e| ApiError::invalid(field_name(name), e))?;
    }
    if req.quantity == 0 || req.quantity > max_quantity {
        return Err(ApiError::invalid(
            field_name("quantity"),
            format!("must be between 1 and {max_quantity}, got {}", req.quantity),
        ));
    }
    if req.order_type == OrderType::Scheduled && req.processing_time.is_none() {
        return Err(ApiError::invalid(
            field_name("processing_time"),
            "required for a SCHEDULED order",
        ));
    }
    Ok(())
}

/// A Try's service error as the API answers it. After [`check_try`], an invalid
/// `order_item_id` is a repeat of (order_item_id, dish_id) with another order, merchant or
/// quantity: the item is taken by a stored Try, a conflict with that state (409
/// `order_item_conflict`), not a malformed request.
pub fn try_error(e: ServiceError) -> ApiError {
    match e {
        ServiceError::Invalid {
            field: "order_item_id",
            message,
        } => ApiError::conflict("order_item_conflict", Some("order_item_id"), message),
        other => ApiError::from(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "u64_integer")]
        id: u64,
        #[serde(deserialize_with = "u32_integer")]
        quantity: u32,
    }

    fn parse(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_numbers_in_any_notation_are_integers() {
        let b = parse(r#"{"id": 9223372036854775807, "quantity": 9.0}"#).expect("valid");
        assert_eq!((b.id, b.quantity), (i64::MAX as u64, 9));
        assert_eq!(
            parse(r#"{"id": 1e3, "quantity": 1}"#).expect("1e3").id,
            1000
        );
        assert_eq!(
            parse(r#"{"id": 0, "quantity": 0.0}"#)
                .expect("zero")
                .quantity,
            0
        );
    }

    #[test]
    fn fractions_negatives_and_inexact_floats_are_refused() {
        for (json, says) in [
            (r#"{"id": 1.5, "quantity": 1}"#, "whole number"),
            (r#"{"id": -3, "quantity": 1}"#, "negative"),
            (r#"{"id": 9007199254740993.0, "quantity": 1}"#, "2^53"),
            (r#"{"id": "7", "quantity": 1}"#, "integer"),
            (r#"{"id": 1, "quantity": 4294967296}"#, "at most"),
        ] {
            let err = parse(json).expect_err(json);
            assert!(err.contains(says), "{json}: {err}");
        }
    }
}
