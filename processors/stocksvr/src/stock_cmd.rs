//! Operator commands for stock buckets, WAL operations and stuck reservations. They run the
//! same code as the admin endpoints (WAL → Lua → outbox), directly against MySQL and Redis,
//! and print JSON so the output can be read and piped.

use anyhow::Context;
use clap::Subcommand;
use serde::Serialize;
use std::process::ExitCode;
use std::sync::Arc;
use stocksvr::Settings;
use stocksvr_core::bucket::{self, BucketKey, BucketState};
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_reservation::operations::WalView;
use stocksvr_reservation::{ReservationService, ServiceConfig, StockOps};
use stocksvr_store::baselines::Baseline;
use stocksvr_store::lua::LuaExecutor;
use stocksvr_store::wal::WalStatus;

/// An id on the command line follows the same contract as the API (positive, an Avro long).
fn id_arg(raw: &str) -> Result<u64, String> {
    stocksvr_core::ids::parse_id(raw)
}

#[derive(Subcommand)]
pub enum BucketAction {
    /// Create one dish's bucket for one business day: baseline + WAL + Redis (idempotent:
    /// an existing baseline is kept as it is).
    Init {
        #[arg(long, value_parser = id_arg)]
        merchant_id: u64,
        #[arg(long, value_parser = id_arg)]
        dish_id: u64,
        /// Business day YYYY-MM-DD; default: today in the time zone.
        #[arg(long)]
        date: Option<String>,
        #[arg(long)]
        total: i64,
        /// The merchant's IANA time zone, stored for every later Try; default: the zone
        /// already configured for the merchant (or `reservation.default_timezone`).
        #[arg(long)]
        timezone: Option<String>,
    },
    /// Set a new total: available = max(0, total - reserved - sold); a deficit is recorded
    /// when accepted orders exceed it (they are never cancelled).
    Adjust {
        bucket_id: String,
        #[arg(long)]
        total: i64,
    },
    /// Stop new Trys; Confirm, Cancel and Refund of existing reservations go on.
    Close { bucket_id: String },
    /// Archive a CLOSED bucket without unfinished reservations; its Redis key then expires.
    Archive { bucket_id: String },
    /// Baseline, Redis and snapshot side by side, with the bucket's WAL rows.
    Show { bucket_id: String },
    /// Rebuild buckets Redis lost from MySQL (baseline, ledger, reservations, fences), then
    /// reopen each once a reconcile pass finds it clean. A dry run listing what would be
    /// rebuilt unless --execute.
    Rebuild {
        /// One bucket; or --all for every bucket found lost.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        bucket_id: Option<String>,
        #[arg(long)]
        all: bool,
        #[arg(long)]
        execute: bool,
        /// Buckets rebuilt at once with --all.
        #[arg(long, default_value_t = 8)]
        parallel: usize,
    },
}

#[derive(Subcommand)]
pub enum OpsAction {
    /// WAL rows (default: everything not SUCCEEDED).
    List {
        /// INIT, EXECUTING, SUCCEEDED, RETRY or DEAD; repeatable.
        #[arg(long)]
        status: Vec<String>,
        #[arg(long)]
        bucket: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Run one RETRY or DEAD operation now (one more attempt: a dead one that fails again
    /// stays dead).
    Retry { operation_id: String },
}

#[derive(Subcommand)]
pub enum ReservationsAction {
    /// Intermediate reservations that failed or are overdue, and dead ones.
    Stuck {
        /// Only those recovery gave up on.
        #[arg(long)]
        dead: bool,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Resume one reservation's step now with its stored operation id (clears the dead mark).
    Retry {
        #[arg(value_parser = id_arg)]
        reservation_id: u64,
    },
}

async fn connect(settings: &Settings) -> anyhow::Result<(sqlx::MySqlPool, Arc<LuaExecutor>)> {
    crate::connect::connect_with(settings, 2).await
}

fn print<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Exit 0 when the operation finished, 3 when it is still pending (the WAL worker of a
/// running `stocksvr all` completes it), 1 when it is dead.
fn operation_exit(view: &WalView) -> ExitCode {
    match view.status {
        s if s == WalStatus::Succeeded.name() => ExitCode::SUCCESS,
        s if s == WalStatus::Dead.name() => ExitCode::FAILURE,
        _ => ExitCode::from(3),
    }
}

fn check_bucket(id: &str) -> anyhow::Result<()> {
    bucket::parse_bucket_id(id)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("bucket id {id:?}: {e}"))
}

pub async fn bucket(settings: &Settings, action: BucketAction) -> anyhow::Result<ExitCode> {
    if let BucketAction::Rebuild {
        bucket_id,
        all,
        execute,
        parallel,
    } = action
    {
        if let Some(b) = &bucket_id {
            check_bucket(b)?;
        }
        let target = if all { None } else { bucket_id };
        return crate::rebuild_cmd::rebuild(settings, target, execute, parallel).await;
    }
    let (pool, lua) = connect(settings).await?;
    let ops = StockOps::new(pool.clone(), lua, settings.stock_ops.ops_config());
    let view = match action {
        BucketAction::Init {
            merchant_id,
            dish_id,
            date,
            total,
            timezone,
        } => {
            anyhow::ensure!(total >= 0, "--total must not be negative");
            // Only an explicit --timezone changes the merchant's zone: every later Try of
            // the merchant picks its business day in it.
            let timezone = match timezone {
                Some(name) => {
                    bucket::parse_timezone(&name)?;
                    stocksvr_store::baselines::set_merchant_timezone(&pool, merchant_id, &name)
                        .await?;
                    name
                }
                None => {
                    match stocksvr_store::baselines::merchant_timezone(&pool, merchant_id).await? {
                        Some(name) => name,
                        None => settings.reservation.default_timezone.clone(),
                    }
                }
            };
            let tz = bucket::parse_timezone(&timezone)?;
            let date = match date {
                Some(d) => chrono::NaiveDate::parse_from_str(&d, "%Y-%m-%d")
                    .with_context(|| format!("--date {d:?}"))?,
                None => bucket::business_date(chrono::Utc::now(), tz),
            };
            let key = BucketKey::new(merchant_id, dish_id, date);
            let view = ops
                .init_bucket(&Baseline {
                    stock_bucket_id: key.stock_bucket_id(),
                    merchant_id,
                    dish_id,
                    stock_date: date,
                    timezone: timezone.clone(),
                    total_stock: total,
                    baseline_version: 1,
                    stock_status: 1,
                    bucket_status: BucketState::Open.code() as i8,
                    lost_at: None,
                })
                .await?;
            let stored = stocksvr_store::baselines::find_baseline(&pool, &key.stock_bucket_id())
                .await?
                .context("baseline missing right after its insert")?;
            eprintln!(
                "bucket {}: merchant {merchant_id} dish {dish_id} day {date} ({timezone}) total {} baseline v{}: {}",
                stored.stock_bucket_id, stored.total_stock, stored.baseline_version, view.status
            );
            view
        }
        BucketAction::Adjust { bucket_id, total } => {
            check_bucket(&bucket_id)?;
            ops.adjust(&bucket_id, total).await?
        }
        BucketAction::Close { bucket_id } => {
            check_bucket(&bucket_id)?;
            ops.close(&bucket_id).await?
        }
        BucketAction::Archive { bucket_id } => {
            check_bucket(&bucket_id)?;
            ops.archive(&bucket_id).await?
        }
        BucketAction::Show { bucket_id } => {
            check_bucket(&bucket_id)?;
            print(&ops.show_bucket(&bucket_id).await?)?;
            return Ok(ExitCode::SUCCESS);
        }
        // Taken above, before connecting with a pool sized for it.
        BucketAction::Rebuild { .. } => anyhow::bail!("rebuild runs before this match"),
    };
    print(&view)?;
    Ok(operation_exit(&view))
}

pub async fn operations(settings: &Settings, action: OpsAction) -> anyhow::Result<ExitCode> {
    let (pool, lua) = connect(settings).await?;
    let ops = StockOps::new(pool, lua, settings.stock_ops.ops_config());
    match action {
        OpsAction::List {
            status,
            bucket,
            limit,
        } => {
            let statuses = if status.is_empty() {
                vec![
                    WalStatus::Init,
                    WalStatus::Executing,
                    WalStatus::Retry,
                    WalStatus::Dead,
                ]
            } else {
                status
                    .iter()
                    .map(|s| {
                        WalStatus::parse(s).ok_or_else(|| {
                            anyhow::anyhow!(
                                "--status {s:?}: INIT, EXECUTING, SUCCEEDED, RETRY or DEAD"
                            )
                        })
                    })
                    .collect::<anyhow::Result<_>>()?
            };
            let rows = ops
                .list(&statuses, bucket.as_deref(), limit.clamp(1, 1000))
                .await?;
            eprintln!("{} operation(s)", rows.len());
            print(&rows)?;
            Ok(ExitCode::SUCCESS)
        }
        OpsAction::Retry { operation_id } => {
            let view = ops.retry_now(&operation_id).await?;
            print(&view)?;
            Ok(operation_exit(&view))
        }
    }
}

pub async fn reservations(
    settings: &Settings,
    action: ReservationsAction,
) -> anyhow::Result<ExitCode> {
    let (pool, lua) = connect(settings).await?;
    // Retrying a step never mints a reservation id, so any worker id will do here; the
    // configured one is used when set.
    let ids = SnowflakeGenerator::new(settings.reservation.worker_id.unwrap_or(0))
        .map_err(|e| anyhow::anyhow!("reservation.worker_id: {e}"))?;
    let service = ReservationService::new(pool, lua, ids, ServiceConfig::default());
    match action {
        ReservationsAction::Stuck { dead, limit } => {
            let rows = service.list_stuck(dead, limit.clamp(1, 1000)).await?;
            eprintln!("{} reservation(s)", rows.len());
            print(&rows)?;
            Ok(ExitCode::SUCCESS)
        }
        ReservationsAction::Retry { reservation_id } => {
            let view = service.retry_now(reservation_id).await?;
            print(&view)?;
            Ok(if view.dead || view.retry_count > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}
