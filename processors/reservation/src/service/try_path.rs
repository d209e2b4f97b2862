//! Try (docs/design.md, Try): idempotent on (order_item_id, dish_id). A repeat returns the first
//! outcome (finishing a Try left PREPARING); a CANCELED reservation is never revived.

use super::step::Prepared;
use super::{error_label, ReservationService, TryReply, TryRequest};
use crate::error::ServiceError;
use crate::failpoint;
use chrono::{DateTime, NaiveDateTime, Utc};
use chrono_tz::Tz;
use std::time::Instant;
use stocksvr_core::bucket::{self, BucketKey, BucketState};
use stocksvr_core::codes::{RejectReason, StockStatus};
use stocksvr_core::events::OrderType;
use stocksvr_core::reservation::{self as rules, ReservationStatus};
use stocksvr_store::baselines::Baseline;
use stocksvr_store::reservations::{
    self as repo, Completion, InsertOutcome, NewReservation, Reservation,
};
use stocksvr_telemetry::names;

/// Whether a baseline row lets Trys in (its lost mark aside): only such a row is kept for
/// [`crate::cache::STATIC_TTL`].
fn takes_trys(b: &Baseline) -> bool {
    stock_enabled(b) && b.state() == Some(BucketState::Open)
}

/// Whether the dish's stock is on for the bucket (a disabled dish takes no Try).
fn stock_enabled(b: &Baseline) -> bool {
    StockStatus::from_code(b.stock_status) == Some(StockStatus::Enabled)
}

/// `reject_reason` of a Try whose order failed before it reached MySQL.
pub const REJECTED_ORDER_FAILED: &str = RejectReason::OrderFailed.name();

impl ReservationService {
    /// The merchant's zone, or the default when none is configured or it is unreadable.
    pub async fn timezone(&self, merchant_id: u64) -> Result<Tz, ServiceError> {
        if let Some(tz) = self.timezones.get(&merchant_id) {
            return Ok(tz);
        }
        let tz = self.read_timezone(merchant_id).await?;
        self.timezones.put(merchant_id, tz);
        Ok(tz)
    }

    async fn read_timezone(&self, merchant_id: u64) -> Result<Tz, ServiceError> {
        Ok(match stocksvr_store::baselines::merchant_timezone(&self.pool, merchant_id).await? {
            Some(name) => bucket::parse_timezone(&name).unwrap_or_else(|e| {
                tracing::warn!(merchant_id, %e, "merchant time zone unreadable; using the default");
                self.config.default_timezone
            }),
            None => self.config.default_timezone,
        })
    }

    /// The bucket a Try of `req` uses: chosen by order type in the merchant's time zone.
    pub async fn bucket_for(
        &self,
        req: &TryRequest,
        now: DateTime<Utc>,
    ) -> Result<BucketKey, ServiceError> {
        let tz = self.timezone(req.merchant_id).await?;
        let date = bucket::bucket_date_for(
            req.order_type,
            now,
            req.processing_time,
            tz,
            self.config.scheduled_grace,
        )
        .map_err(|e| ServiceError::Invalid {
            field: "processing_time",
            message: e.to_string(),
        })?;
        Ok(BucketKey::new(req.merchant_id, req.dish_id, date))
    }

    fn validate(&self, req: &TryRequest) -> Result<(), ServiceError> {
        let invalid = |field, message: String| Err(ServiceError::Invalid { field, message });
        if req.quantity == 0 || req.quantity > self.config.max_quantity {
            return invalid(
                "quantity",
                format!(
                    "must be between 1 and {}, got {}",
                    self.config.max_quantity, req.quantity
                ),
            );
        }
        for (field, value) in [
            ("order_id", req.order_id),
            ("order_item_id", req.order_item_id),
            ("merchant_id", req.merchant_id),
            ("dish_id", req.dish_id),
        ] {
            if let Err(message) = stocksvr_core::ids::check_id(value) {
                return invalid(field, message);
            }
        }
        if req.order_type == OrderType::Scheduled && req.processing_time.is_none() {
            return invalid("processing_time", "required for a SCHEDULED order".into());
        }
        Ok(())
    }

    /// Try: idempotent on (order_item_id, dish_id). A repeat returns the first
    /// outcome (finishing a Try left PREPARING); a CANCELED reservation is never revived.
    #[tracing::instrument(skip_all, fields(order_id = req.order_id, order_item_id = req.order_item_id, dish_id = req.dish_id), err)]
    pub async fn try_reserve(&self, req: &TryRequest) -> Result<TryReply, ServiceError> {
        let started = Instant::now();
        let result = self.try_reserve_inner(req).await;
        let outcome = match &result {
            Ok(reply) => reply.reservation.status_name(),
            Err(e) => error_label(e),
        };
        metrics::counter!(names::RESERVATION_OPERATIONS, "operation" => "try", "outcome" => outcome.to_string()).increment(1);
        metrics::histogram!(names::RESERVATION_OPERATION_SECONDS, "operation" => "try")
            .record(started.elapsed().as_secs_f64());
        result
    }

    async fn try_reserve_inner(&self, req: &TryRequest) -> Result<TryReply, ServiceError> {
        self.validate(req)?;
        // A client that did not hear back retries: its repeat waits for the first request
        // of the same item here and then reads that outcome, instead of racing it.
        let _turn = self.turns.take((req.order_item_id, req.dish_id)).await;
        let now = Utc::now();
        let key = self.bucket_for(req, now).await?;
        let bucket_id = key.stock_bucket_id();
        if let Err(refused) = self.open_for_trys(&bucket_id).await {
            // A repeat of a Try that got in before the bucket closed (or was lost) still
            // answers with its first outcome.
            return match repo::find_by_item(&self.pool, req.order_item_id, req.dish_id).await? {
                Some(existing) => self.repeat_try(existing, req).await,
                None => Err(refused),
            };
        }
        let id = self.ids.next_id().map_err(|e| ServiceError::Inconsistent {
            reservation_id: 0,
            reason: format!("snowflake: {e}"),
        })?;
        let expire_from = match (req.order_type, req.processing_time) {
            (OrderType::Scheduled, Some(p)) => p.max(now),
            _ => now,
        };
        let new = NewReservation {
            id,
            order_id: req.order_id,
            order_item_id: req.order_item_id,
            merchant_id: req.merchant_id,
            dish_id: req.dish_id,
            stock_bucket_id: bucket_id,
            stock_date: key.stock_date,
            quantity: req.quantity,
            order_type: req.order_type.code() as i8,
            processing_time: req.processing_time.map(|t| t.naive_utc()),
            expire_at: (expire_from + self.config.hold_ttl).naive_utc(),
            try_operation_id: rules::try_operation_id(id),
        };
        failpoint::hit("try.before_insert")?;
        // The insert is the first lookup too: a repeat meets the item's unique key.
        let (at, outcome) = self.insert_preparing(&new).await?;
        match outcome {
            InsertOutcome::Inserted => {}
            InsertOutcome::Existing(existing) => return self.repeat_try(*existing, req).await,
            InsertOutcome::OrderFailed => return self.reject_failed_order(&new, req).await,
        }
        let row = match self.prepare_step(new.inserted_row(at)).await? {
            Prepared::Commit {
                row,
                status: ReservationStatus::Preparing,
                completion,
            } => self.commit_try(row, completion).await?,
            other => self.finish_step(other).await?,
        };
        Ok(TryReply {
            reservation: row,
            created: true,
        })
    }

    /// Whether the bucket takes new Trys, judged on its baseline row (an OPEN one kept for
    /// [`crate::cache::STATIC_TTL`], any other for `try_cache_ttl`: Redis refuses a closed or
    /// absent bucket itself) and on the list of lost buckets (read at most `try_cache_ttl` ago).
    async fn open_for_trys(&self, bucket_id: &str) -> Result<(), ServiceError> {
        let key = bucket_id.to_string();
        let cached = self
            .baselines
            .get_aged(&key)
            .and_then(|(age, b)| (age < self.config.try_cache_ttl || takes_trys(&b)).then_some(b));
        let (baseline, fresh) = match cached {
            Some(b) => (b, false),
            None => (self.read_baseline(&key).await?, true),
        };
        if !stock_enabled(&baseline) {
            return Err(ServiceError::BucketUnavailable {
                bucket: key,
                reason: "the dish's stock is disabled",
            });
        }
        if baseline.state() != Some(BucketState::Open) {
            return Err(ServiceError::BucketUnavailable {
                bucket: key,
                reason: "the bucket is closed for new reservations",
            });
        }
        // Redis lost this bucket: refused before any row is written, until it is rebuilt
        // and a reconcile pass found it clean. A row read just now tells; a kept one does
        // not (its mark may have come or gone since): the lost list does.
        let lost = if fresh {
            baseline.lost_at.is_some()
        } else {
            match self.lost.is_lost(&self.pool, bucket_id).await? {
                Some(lost) => lost,
                None => self.read_baseline(&key).await?.lost_at.is_some(),
            }
        };
        if lost {
            return Err(ServiceError::BucketLost { bucket: key });
        }
        Ok(())
    }

    async fn read_baseline(&self, key: &str) -> Result<Baseline, ServiceError> {
        let b = stocksvr_store::baselines::find_baseline(&self.pool, key)
            .await?
            .ok_or_else(|| ServiceError::BucketNotFound(key.to_string()))?;
        self.baselines.put(key.to_string(), b.clone());
        Ok(b)
    }

    /// The PREPARING insert, in a group with concurrent Trys when group commit is on.
    async fn insert_preparing(
        &self,
        new: &NewReservation,
    ) -> Result<(NaiveDateTime, InsertOutcome), ServiceError> {
        let (at, mut outcomes) = match &self.groups {
            Some(groups) => {
                let (at, outcome) = groups
                    .inserts
                    .submit(new.clone())
                    .await
                    .unwrap_or_else(|| Err(super::group::worker_gone()))?;
                (at, vec![outcome])
            }
            None => repo::insert_preparing_many(&self.pool, std::slice::from_ref(new)).await?,
        };
        let outcome = outcomes.pop().ok_or_else(super::group::worker_gone)?;
        Ok((at, outcome))
    }

    /// Commits a Try's completion, in a group with concurrent Trys when group commit is on.
    async fn commit_try(
        &self,
        row: Reservation,
        completion: Completion,
    ) -> Result<Reservation, ServiceError> {
        let id = row.id;
        let landed = self.complete_grouped(row, &completion).await?;
        self.landed(id, landed, &completion).await
    }

    /// A Try that arrives after its order failed (the OrderCreatedFailed came first, say the
    /// order service gave up waiting for this very Try): nothing is held, the row is
    /// REJECTED with reason ORDER_FAILED, and the order domain hears it once.
    async fn reject_failed_order(
        &self,
        new: &NewReservation,
        req: &TryRequest,
    ) -> Result<TryReply, ServiceError> {
        let reason = REJECTED_ORDER_FAILED;
        let row = new.to_row(ReservationStatus::Rejected, Some(reason));
        let event = crate::outbox::rejected(&row, &row.current_operation_id, reason, None);
        let created =
            stocksvr_store::order_events::insert_rejected(&self.pool, new, reason, &event).await?;
        if created {
            self.outbox_committed();
            metrics::counter!(names::FENCE_HITS, "kind" => "order_fenced").increment(1);
            tracing::info!(
                order_id = req.order_id,
                order_item_id = req.order_item_id,
                dish_id = req.dish_id,
                "Try of a failed order refused: nothing held"
            );
        }
        match repo::find_by_item(&self.pool, req.order_item_id, req.dish_id).await? {
            Some(existing) if !created => self.repeat_try(existing, req).await,
            Some(existing) => Ok(TryReply {
                reservation: existing,
                created: true,
            }),
            None => Err(ServiceError::Mysql(sqlx::Error::PoolTimedOut)),
        }
    }

    async fn repeat_try(
        &self,
        existing: Reservation,
        req: &TryRequest,
    ) -> Result<TryReply, ServiceError> {
        if existing.order_id != req.order_id
            || existing.merchant_id != req.merchant_id
            || existing.quantity != req.quantity
        {
            return Err(ServiceError::Invalid {
                field: "order_item_id",
                message: format!(
                    "item {} dish {} is already reserved as reservation {} with different order, merchant or quantity",
                    req.order_item_id, req.dish_id, existing.id
                ),
            });
        }
        let row = if existing.status()? == ReservationStatus::Preparing {
            self.run_step(existing).await?
        } else {
            existing
        };
        Ok(TryReply {
            reservation: row,
            created: false,
        })
    }
}
