//! The reservation service: one type, its configuration and what its operations answer.
//! The operations live beside it, one concern a file:
//!
//! - [`try_path`]: Try (docs/design.md, Try), idempotent on (order_item_id, dish_id);
//! - [`intents`]: Confirm, MarkCreated, Cancel and Refund (docs/design.md), each a CAS into an
//!   intermediate status followed by its step, and conflict reports;
//! - [`step`]: running (or resuming) the Redis step of an intermediate status and committing
//!   its completion: also what the recovery worker calls;
//! - [`completion`]: the pure decision of what a finished step commits (the next status and
//!   the outbox rows), unit-tested like the projector's `decide`.

mod completion;
pub(crate) mod group;
mod intents;
mod missing;
mod step;
mod try_path;
mod turns;

pub use intents::Target;
pub use try_path::REJECTED_ORDER_FAILED;

use crate::cache::{self, BaselineCache, LostBuckets, TtlCache};
use crate::error::ServiceError;
use crate::operations::{OpsConfig, StockOps};
use crate::view::StuckView;
use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use sqlx::MySqlPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::events::OrderType;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_store::lua::LuaExecutor;
use stocksvr_store::reservations::{self as repo, Reservation};

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Time zone of merchants without a `merchant_settings` row.
    pub default_timezone: Tz,
    /// A RESERVED row past `created_at + hold_ttl` is alerted (never cancelled).
    pub hold_ttl: TimeDelta,
    /// How far in the past a scheduled order's processing_time may lie.
    pub scheduled_grace: TimeDelta,
    /// Largest quantity one Try may reserve.
    pub max_quantity: u32,
    /// Immediate retries of a Redis call whose outcome is unknown, before the row is left
    /// to the recovery worker.
    pub unknown_retries: usize,
    /// First delay before the recovery worker retries a failed step; doubles per attempt.
    pub recovery_delay: TimeDelta,
    /// Longest delay between two recovery attempts.
    pub recovery_max_delay: TimeDelta,
    /// Failed attempts after which recovery gives up: the row is marked dead and alerted.
    pub recovery_max_attempts: u32,
    /// Time-to-live of Redis operation records (idempotency window).
    pub op_ttl: Duration,
    /// How old the Try path's list of lost buckets may be, and how long it keeps a baseline
    /// row that does not take Trys (at most [`cache::MAX_TTL`]); zero reads the bucket's row
    /// and the merchant's time zone for every Try. OPEN rows and time zones are kept for
    /// [`cache::STATIC_TTL`] otherwise.
    pub try_cache_ttl: Duration,
    /// Largest group written together by group commit: Trys inserted with one INSERT, steps
    /// begun with one CAS (Confirm, Cancel), steps completed in one transaction (all but
    /// refunds); 1 writes each row alone.
    pub try_group_max: usize,
    /// Groups in flight at the same time in each group-commit worker (each MySQL group
    /// holds one connection).
    pub try_groups_in_flight: usize,
    /// With group commit on: the Trys of a group go to Redis in one `try.lua` call per
    /// bucket (each item as its own call would have run) instead of one call each.
    pub try_lua_group: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            default_timezone: chrono_tz::UTC,
            hold_ttl: TimeDelta::minutes(30),
            scheduled_grace: TimeDelta::minutes(5),
            max_quantity: 999,
            unknown_retries: 3,
            recovery_delay: TimeDelta::seconds(1),
            recovery_max_delay: TimeDelta::minutes(5),
            recovery_max_attempts: 20,
            op_ttl: Duration::from_secs(30 * 24 * 3600),
            try_cache_ttl: Duration::from_secs(2),
            try_group_max: 64,
            try_groups_in_flight: 1,
            try_lua_group: false,
        }
    }
}

/// One dish of one order item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryRequest {
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub quantity: u32,
    pub order_type: OrderType,
    pub processing_time: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TryReply {
    pub reservation: Reservation,
    /// False when this request repeated an earlier Try of the same item and dish.
    pub created: bool,
}

/// What Confirm, Cancel, Refund and MarkCreated ended in.
#[derive(Debug, Clone, PartialEq)]
pub enum IntentOutcome {
    /// The step ran (or had already run: `already` true) and the row is in its new status.
    Done {
        reservation: Box<Reservation>,
        already: bool,
    },
    /// Too early (e.g. Confirm while the Try is PREPARING): retry later.
    NotYet { status: ReservationStatus },
    /// Incompatible with the current status: report it, do not retry.
    Conflict {
        status: ReservationStatus,
        reason: &'static str,
    },
}

pub struct ReservationService {
    pool: MySqlPool,
    lua: Arc<LuaExecutor>,
    ids: SnowflakeGenerator,
    config: ServiceConfig,
    /// Woken after every commit that wrote outbox rows, so the relay publishes at once
    /// instead of at its next poll.
    outbox_written: Option<Arc<tokio::sync::Notify>>,
    /// Bucket init, adjust and lifecycle through the operation WAL (also the lazy init).
    ops: StockOps,
    timezones: TtlCache<u64, Tz>,
    baselines: Arc<BaselineCache>,
    lost: LostBuckets,
    /// One Try per (order_item_id, dish_id) at a time in this process.
    turns: turns::Turns<(u64, u64)>,
    /// Group commit (the Try path, step begins and completions); None outside a Tokio
    /// runtime or with groups of one.
    groups: Option<group::StepGroups>,
}

impl ReservationService {
    pub fn new(
        pool: MySqlPool,
        lua: Arc<LuaExecutor>,
        ids: SnowflakeGenerator,
        config: ServiceConfig,
    ) -> Self {
        // Nothing is kept when the cache is off; otherwise OPEN rows and time zones live
        // longer than the lost list (see `cache`).
        let kept = if config.try_cache_ttl.is_zero() {
            Duration::ZERO
        } else {
            cache::STATIC_TTL
        };
        let baselines = Arc::new(TtlCache::new(kept));
        let ops = StockOps::new(pool.clone(), lua.clone(), OpsConfig::default())
            .with_baseline_cache(baselines.clone());
        let groups = (config.try_group_max > 1 && tokio::runtime::Handle::try_current().is_ok())
            .then(|| {
                group::StepGroups::start(
                    &pool,
                    config.try_lua_group.then_some(&lua),
                    config.try_group_max,
                    config.try_groups_in_flight,
                )
            });
        Self {
            timezones: TtlCache::new(kept),
            baselines,
            lost: LostBuckets::new(config.try_cache_ttl),
            turns: turns::Turns::new(),
            groups,
            pool,
            lua,
            ids,
            config,
            outbox_written: None,
            ops,
        }
    }

    /// Wakes `relay` after each commit that wrote outbox rows.
    pub fn with_outbox_waker(mut self, relay: Arc<tokio::sync::Notify>) -> Self {
        self.ops = self.ops.with_outbox_waker(relay.clone());
        self.outbox_written = Some(relay);
        self
    }

    /// Replaces the stock-operation settings (lease, retries, archive TTL).
    pub fn with_ops_config(mut self, config: OpsConfig) -> Self {
        let mut ops = StockOps::new(self.pool.clone(), self.lua.clone(), config)
            .with_baseline_cache(self.baselines.clone());
        if let Some(relay) = &self.outbox_written {
            ops = ops.with_outbox_waker(relay.clone());
        }
        self.ops = ops;
        self
    }

    /// Bucket init, adjust and lifecycle (the operation WAL).
    pub fn ops(&self) -> &StockOps {
        &self.ops
    }

    /// Drops this process's cached baseline row of `bucket` (closed, reopened, rebuilt), so
    /// the next Try here reads it again instead of waiting out the cache's time to live.
    pub fn baseline_changed(&self, bucket: &str) {
        self.baselines.forget(&bucket.to_string());
    }

    fn outbox_committed(&self) {
        if let Some(waker) = &self.outbox_written {
            waker.notify_one();
        }
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    pub fn lua(&self) -> &LuaExecutor {
        &self.lua
    }

    pub async fn get(&self, id: u64) -> Result<Option<Reservation>, ServiceError> {
        Ok(repo::find(&self.pool, id).await?)
    }

    pub async fn list_order(&self, order_id: u64) -> Result<Vec<Reservation>, ServiceError> {
        Ok(repo::list_by_order(&self.pool, order_id).await?)
    }

    /// The reservations of each of `order_ids` that has any, in one read.
    pub async fn list_orders(
        &self,
        order_ids: &[u64],
    ) -> Result<HashMap<u64, Vec<Reservation>>, ServiceError> {
        let mut by_order: HashMap<u64, Vec<Reservation>> = HashMap::new();
        for row in repo::list_by_orders(&self.pool, order_ids).await? {
            by_order.entry(row.order_id).or_default().push(row);
        }
        Ok(by_order)
    }

    async fn load(&self, id: u64) -> Result<Reservation, ServiceError> {
        repo::find(&self.pool, id)
            .await?
            .ok_or(ServiceError::NotFound(id))
    }

    /// Exponential backoff for the next recovery attempt of a row that failed `retry_count` times.
    fn retry_delay(&self, retry_count: u32) -> TimeDelta {
        stocksvr_core::backoff::jittered_delta(
            retry_count,
            self.config.recovery_delay,
            self.config.recovery_max_delay,
        )
    }

    /// Stuck (intermediate and failing or overdue) and dead reservations, oldest first.
    pub async fn list_stuck(
        &self,
        dead_only: bool,
        limit: u32,
    ) -> Result<Vec<StuckView>, ServiceError> {
        Ok(repo::list_stuck(&self.pool, dead_only, limit)
            .await?
            .iter()
            .map(StuckView::from_row)
            .collect())
    }

    /// An operator's "retry now": clears the dead mark and backoff, then resumes the step
    /// with its stored operation id (a finished row is returned as it is).
    pub async fn retry_now(&self, id: u64) -> Result<StuckView, ServiceError> {
        if !repo::revive(&self.pool, id).await? {
            return Err(ServiceError::NotFound(id));
        }
        let row = self.load(id).await?;
        let row = match self.run_step(row).await {
            Ok(row) => row,
            // The failure is recorded on the row (retry_count, last_error); show it.
            Err(e) if !matches!(e, ServiceError::Mysql(_)) => {
                tracing::warn!(reservation_id = id, error = %e, "operator retry failed");
                self.load(id).await?
            }
            Err(e) => return Err(e),
        };
        Ok(StuckView::from_row(&row))
    }

    /// Runs (or resumes) the Redis step of an intermediate status with its stored operation
    /// id and completes it in MySQL. This is also what the recovery worker calls.
    pub async fn resume(&self, id: u64) -> Result<Reservation, ServiceError> {
        let row = self.load(id).await?;
        self.run_step(row).await
    }
}

/// The service's stock operations, for the WAL worker and the daily job.
impl AsRef<StockOps> for ReservationService {
    fn as_ref(&self) -> &StockOps {
        &self.ops
    }
}

/// The service's MySQL pool, for the gauges.
impl AsRef<MySqlPool> for ReservationService {
    fn as_ref(&self) -> &MySqlPool {
        &self.pool
    }
}

/// The `outcome` label of a failed operation.
fn error_label(e: &ServiceError) -> &'static str {
    match e {
        ServiceError::Invalid { .. } => "invalid",
        ServiceError::NotFound(_) => "not_found",
        ServiceError::BucketNotFound(_) => "bucket_not_found",
        ServiceError::BucketUnavailable { .. } => "bucket_unavailable",
        ServiceError::OverRefund { .. } => "over_refund",
        ServiceError::OutcomeUnknown { .. } => "unknown",
        ServiceError::Mysql(_) => "unavailable",
        ServiceError::Inconsistent { .. } => "inconsistent",
        ServiceError::BucketLost { .. } => "bucket_lost",
    }
}
