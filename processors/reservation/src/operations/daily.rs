//! The daily bucket job (docs/design.md, daily buckets and their lifecycle): today's missing
//! buckets and, ahead of the local midnight, tomorrow's, each carried forward from the dish's
//! latest baseline.

use super::*;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_telemetry::names;

/// What a daily preparation round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrepareReport {
    /// Buckets initialised (baseline + WAL + Redis) in this round.
    pub prepared: usize,
    /// Buckets whose init did not finish now; the WAL worker retries them.
    pub pending: usize,
}

impl StockOps {
    /// The daily job: for every time zone baselines exist in, makes sure today's
    /// buckets exist (catch-up after downtime) and, within `lead` of the local midnight,
    /// tomorrow's, carrying each dish's latest total forward. Each goes baseline + WAL →
    /// Lua → outbox like any init.
    pub async fn prepare_days(
        &self,
        now: DateTime<Utc>,
        lead: TimeDelta,
        lookback_days: i64,
    ) -> Result<PrepareReport, OpsError> {
        let mut report = PrepareReport::default();
        for tz_name in buckets::baseline_timezones(&self.pool).await? {
            let tz = match bucket::parse_timezone(&tz_name) {
                Ok(tz) => tz,
                Err(e) => {
                    tracing::warn!(timezone = %tz_name, error = %e, "baselines in an unknown time zone are not carried forward");
                    continue;
                }
            };
            let today = bucket::business_date(now, tz);
            let mut days = vec![today];
            if let Some(tomorrow) = today.succ_opt() {
                if until_local_midnight(now, tz, tomorrow) <= lead {
                    days.push(tomorrow);
                }
            }
            for day in days {
                self.prepare_day(&tz_name, day, lookback_days, &mut report)
                    .await?;
            }
        }
        if report.prepared + report.pending > 0 {
            tracing::info!(
                prepared = report.prepared,
                pending = report.pending,
                "daily buckets prepared"
            );
        }
        Ok(report)
    }

    async fn prepare_day(
        &self,
        tz_name: &str,
        day: NaiveDate,
        lookback_days: i64,
        report: &mut PrepareReport,
    ) -> Result<(), OpsError> {
        // Each init writes the new day's baseline, which takes the dish off the next page; a
        // page of nothing but dishes already tried (an init refused before writing) ends it.
        let mut tried = std::collections::HashSet::new();
        loop {
            let carry =
                buckets::baselines_to_carry(&self.pool, tz_name, day, lookback_days, 200).await?;
            if carry.iter().all(|b| tried.contains(&b.stock_bucket_id)) {
                return Ok(());
            }
            for from in &carry {
                if !tried.insert(from.stock_bucket_id.clone()) {
                    continue;
                }
                let key = BucketKey::new(from.merchant_id, from.dish_id, day);
                let b = Baseline {
                    stock_bucket_id: key.stock_bucket_id(),
                    merchant_id: from.merchant_id,
                    dish_id: from.dish_id,
                    stock_date: day,
                    timezone: from.timezone.clone(),
                    total_stock: from.total_stock,
                    baseline_version: 1,
                    stock_status: from.stock_status,
                    bucket_status: BucketState::Open.code() as i8,
                    lost_at: None,
                };
                match self.init_bucket(&b).await {
                    Ok(v) if v.succeeded() => {
                        report.prepared += 1;
                        metrics::counter!(names::DAILY_BUCKETS_PREPARED).increment(1);
                    }
                    Ok(v) => {
                        report.pending += 1;
                        tracing::warn!(bucket = %b.stock_bucket_id, status = v.status, "next-day bucket not initialised yet; the WAL worker retries it");
                    }
                    Err(OpsError::Mysql(e)) => return Err(OpsError::Mysql(e)),
                    Err(e) => {
                        report.pending += 1;
                        tracing::warn!(bucket = %b.stock_bucket_id, error = %e, "preparing a bucket failed");
                    }
                }
            }
        }
    }
}

/// Time from `now` to the start of `day` in `tz` (zero or negative once it has begun).
fn until_local_midnight(now: DateTime<Utc>, tz: chrono_tz::Tz, day: NaiveDate) -> TimeDelta {
    use chrono::TimeZone;
    let midnight = day.and_hms_opt(0, 0, 0).unwrap_or_default();
    // A zone that skips midnight (a DST jump) starts the day at the first valid instant.
    let start = tz
        .from_local_datetime(&midnight)
        .earliest()
        .or_else(|| {
            tz.from_local_datetime(&(midnight + TimeDelta::hours(1)))
                .earliest()
        })
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or(now);
    start - now
}

/// Configuration of the daily bucket job.
#[derive(Debug, Clone)]
pub struct DailyConfig {
    /// How often the job looks for buckets to prepare.
    pub interval: Duration,
    /// How long before the local midnight the next day's buckets are prepared.
    pub lead: TimeDelta,
    /// Dishes with no baseline in this many days are not carried forward any more.
    pub lookback_days: i64,
}

impl Default for DailyConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(300),
            lead: TimeDelta::hours(2),
            lookback_days: 7,
        }
    }
}

/// Runs the daily job until `stop`, on the stock operations `ops` holds (the reservation
/// service holds the process's).
pub async fn run_daily<O: AsRef<StockOps>>(
    ops: Arc<O>,
    config: DailyConfig,
    stop: watch::Receiver<bool>,
) -> Result<(), OpsError> {
    tracing::info!(
        interval_s = config.interval.as_secs(),
        lead_min = config.lead.num_minutes(),
        "daily bucket job started"
    );
    let cadence = Cadence::fixed(config.interval);
    periodic::run("daily bucket job", cadence, None, stop, || async {
        if let Err(e) = (*ops)
            .as_ref()
            .prepare_days(Utc::now(), config.lead, config.lookback_days)
            .await
        {
            tracing::warn!(error = %e, "daily bucket round failed; retrying next round");
        }
        Ok(Round::Partial)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn midnight_distance_follows_the_zone() {
        let tz: chrono_tz::Tz = "Asia/Shanghai".parse().unwrap();
        // 14:30 UTC is 22:30 in Shanghai: 90 minutes to the local midnight.
        let now = DateTime::parse_from_rfc3339("2026-07-26T14:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let tomorrow = NaiveDate::from_ymd_opt(2026, 7, 27).unwrap();
        assert_eq!(
            until_local_midnight(now, tz, tomorrow),
            TimeDelta::minutes(90)
        );
        let utc_tomorrow = NaiveDate::from_ymd_opt(2026, 7, 27).unwrap();
        assert_eq!(
            until_local_midnight(now, chrono_tz::UTC, utc_tomorrow),
            TimeDelta::minutes(570)
        );
    }
}
