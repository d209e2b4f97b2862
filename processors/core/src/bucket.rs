//! Daily stock buckets (docs/design.md, daily buckets): identity, Redis keys and which business day an order uses.
//!
//! A bucket is one dish of one merchant on one business day in the merchant's time zone.
//! A reservation binds its bucket at Try and keeps it forever, so a cross-day Cancel or
//! Refund returns units to the day they came from; nothing here is recomputed later.

use chrono::{DateTime, Datelike, NaiveDate, TimeDelta, Utc};
use chrono_tz::Tz;

use crate::events::OrderType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    #[error("malformed stock_bucket_id {0:?}: expected bucket_<merchant>_<dish>_<yyyymmdd>")]
    MalformedBucketId(String),
    #[error("unknown time zone {0:?}: expected an IANA name such as Asia/Shanghai")]
    UnknownTimezone(String),
    #[error("a SCHEDULED order needs a processing_time")]
    MissingProcessingTime,
    #[error("processing_time {processing_time} is more than {grace} before now ({now})")]
    ProcessingTimeInPast {
        processing_time: DateTime<Utc>,
        now: DateTime<Utc>,
        grace: TimeDelta,
    },
}

/// Identity of one daily bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    pub merchant_id: u64,
    pub dish_id: u64,
    /// Business day in the merchant's time zone.
    pub stock_date: NaiveDate,
}

impl BucketKey {
    pub const fn new(merchant_id: u64, dish_id: u64, stock_date: NaiveDate) -> Self {
        Self {
            merchant_id,
            dish_id,
            stock_date,
        }
    }

    /// `bucket_<merchant>_<dish>_<yyyymmdd>`: the id shared by MySQL, Redis and Kafka keys
    /// (at most 57 characters, within `VARCHAR(64)`).
    pub fn stock_bucket_id(&self) -> String {
        let d = self.stock_date;
        format!(
            "bucket_{}_{}_{:04}{:02}{:02}",
            self.merchant_id,
            self.dish_id,
            d.year(),
            d.month(),
            d.day()
        )
    }

    /// `{<merchant>:<dish>:<yyyy-mm-dd>}`: every key of one bucket carries this hash tag so a
    /// Lua script touching the stock, a fence and an op record stays in one cluster slot.
    pub fn redis_hash_tag(&self) -> String {
        let d = self.stock_date;
        format!(
            "{{{}:{}:{:04}-{:02}-{:02}}}",
            self.merchant_id,
            self.dish_id,
            d.year(),
            d.month(),
            d.day()
        )
    }

    /// `inv:{tag}:stock`, the hash with total/available/reserved/sold/version.
    pub fn stock_key(&self) -> String {
        format!("inv:{}:stock", self.redis_hash_tag())
    }

    /// `inv:{tag}:reservation:<id>`, the reservation's fence.
    pub fn fence_key(&self, reservation_id: u64) -> String {
        format!("inv:{}:reservation:{reservation_id}", self.redis_hash_tag())
    }

    /// `inv:{tag}:op:<operation_id>`, the idempotency record of one step.
    pub fn op_key(&self, operation_id: &str) -> String {
        format!("inv:{}:op:{operation_id}", self.redis_hash_tag())
    }
}

impl std::fmt::Display for BucketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.stock_bucket_id())
    }
}

impl std::str::FromStr for BucketKey {
    type Err = BucketError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_bucket_id(s)
    }
}

/// Inverse of [`BucketKey::stock_bucket_id`]. Strict: only the exact spelling that
/// `stock_bucket_id` produces is accepted (no signs, no leading zeros), so one bucket never
/// has two ids that would land in two MySQL rows or two Kafka keys.
pub fn parse_bucket_id(id: &str) -> Result<BucketKey, BucketError> {
    let malformed = || BucketError::MalformedBucketId(id.to_owned());
    let rest = id.strip_prefix("bucket_").ok_or_else(malformed)?;
    let mut parts = rest.split('_');
    let (Some(merchant), Some(dish), Some(date), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(merchant) || !digits(dish) || date.len() != 8 || !digits(date) {
        return Err(malformed());
    }
    let merchant_id = merchant.parse::<u64>().map_err(|_| malformed())?;
    let dish_id = dish.parse::<u64>().map_err(|_| malformed())?;
    let num = |r: std::ops::Range<usize>| date.get(r).and_then(|s| s.parse::<u32>().ok());
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(4..6), num(6..8)) else {
        return Err(malformed());
    };
    let year = i32::try_from(y).map_err(|_| malformed())?;
    let stock_date = NaiveDate::from_ymd_opt(year, m, d).ok_or_else(malformed)?;
    let key = BucketKey::new(merchant_id, dish_id, stock_date);
    if key.stock_bucket_id() != id {
        return Err(malformed());
    }
    Ok(key)
}

/// An IANA zone name as stored in `dish_stock_baseline.timezone`.
pub fn parse_timezone(name: &str) -> Result<Tz, BucketError> {
    name.parse::<Tz>()
        .map_err(|_| BucketError::UnknownTimezone(name.to_owned()))
}

/// The merchant's calendar day at `now` (the business day of docs/design.md, Try).
pub fn business_date(now: DateTime<Utc>, tz: Tz) -> NaiveDate {
    now.with_timezone(&tz).date_naive()
}

/// The business day whose bucket an order's Try must use (docs/design.md, Try).
///
/// INSTANT: today's business day (`processing_time` is ignored). SCHEDULED: the business day
/// of `processing_time`, which is required and may lie in the past by at most `grace`,
/// the slack for the order service's clock and queues; older than that the order is
/// already late and reserving for it would hold units nobody can deliver.
pub fn bucket_date_for(
    order_type: OrderType,
    now: DateTime<Utc>,
    processing_time: Option<DateTime<Utc>>,
    tz: Tz,
    grace: TimeDelta,
) -> Result<NaiveDate, BucketError> {
    match order_type {
        OrderType::Instant => Ok(business_date(now, tz)),
        OrderType::Scheduled => {
            let processing_time = processing_time.ok_or(BucketError::MissingProcessingTime)?;
            if processing_time < now - grace {
                return Err(BucketError::ProcessingTimeInPast {
                    processing_time,
                    now,
                    grace,
                });
            }
            Ok(business_date(processing_time, tz))
        }
    }
}

pub use crate::codes::BucketState;

impl BucketState {
    pub const fn accepts_try(self) -> bool {
        matches!(self, BucketState::Open)
    }

    /// Confirm, Cancel and Refund of reservations already bound to the bucket.
    pub const fn accepts_completion(self) -> bool {
        matches!(self, BucketState::Open | BucketState::Closed)
    }
}
