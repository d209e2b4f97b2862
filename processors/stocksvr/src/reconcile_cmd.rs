//! `stocksvr reconcile` (compare every bucket's three views, repair with `--repair`) and
//! `stocksvr bucket rebuild` (recreate buckets Redis lost). Progress goes to stderr, the
//! table or JSON to stdout.

use crate::stock_cmd::connect_with;
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use stocksvr::Settings;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_reservation::reconcile::classify::Verdict;
use stocksvr_reservation::reconcile::{verdict_name, Checked, Reconciler, RepairOutcome};
use stocksvr_reservation::{ReservationService, ServiceConfig};
use stocksvr_store::reconcile::BucketFilter;

#[derive(Args)]
pub struct ReconcileArgs {
    /// One bucket (bucket_<merchant>_<dish>_<yyyymmdd>).
    #[arg(long, conflicts_with = "merchant")]
    bucket: Option<String>,
    /// Every bucket of one merchant.
    #[arg(long, value_parser = stocksvr_core::ids::parse_id)]
    merchant: Option<u64>,
    /// Only buckets of this business day (YYYY-MM-DD).
    #[arg(long)]
    date: Option<chrono::NaiveDate>,
    /// Repair each confirmed difference (a versioned WAL operation booked by the projector).
    #[arg(long)]
    repair: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

async fn reconciler(settings: &Settings, connections: u32) -> anyhow::Result<Reconciler> {
    let (pool, lua) = connect_with(settings, connections).await?;
    // Repairs and rebuilds never mint a reservation id, so any worker id will do.
    let ids = SnowflakeGenerator::new(settings.reservation.worker_id.unwrap_or(0))
        .map_err(|e| anyhow::anyhow!("reservation.worker_id: {e}"))?;
    let service = ReservationService::new(pool, lua, ids, ServiceConfig::default())
        .with_ops_config(settings.stock_ops.ops_config());
    Ok(Reconciler::new(
        Arc::new(service),
        settings.reconcile.reconcile_config(),
    ))
}

fn progress(n: usize) {
    if n.is_multiple_of(1000) || n < 1000 {
        eprint!("\rreconcile: {n} bucket(s) read");
    }
}

/// Exit 0: every bucket consistent (or every confirmed difference repaired); 1: differences
/// remain; 2: the check itself failed.
pub async fn reconcile(settings: &Settings, args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    if let Some(b) = &args.bucket {
        stocksvr_core::bucket::parse_bucket_id(b)
            .map_err(|e| anyhow::anyhow!("--bucket {b:?}: {e}"))?;
    }
    let reconciler = reconciler(settings, 4).await?;
    let filter = BucketFilter {
        bucket: args.bucket.clone(),
        merchant_id: args.merchant,
        stock_date: args.date,
        shard: None,
    };
    let started = Instant::now();
    let checked = reconciler.check(&filter, args.repair, &progress).await?;
    eprintln!(
        "\rreconcile: {} bucket(s) checked in {:.1} s (two passes {} ms apart)",
        checked.len(),
        started.elapsed().as_secs_f64(),
        reconciler.config().settle.as_millis()
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checked)?);
    } else {
        print_table(&checked);
    }
    let differing = checked.iter().filter(|c| !c.confirmed.is_empty()).count();
    let unrepaired = checked
        .iter()
        .filter(|c| {
            !c.confirmed.is_empty() && !matches!(c.repair, Some(RepairOutcome::Repaired { .. }))
        })
        .count();
    let lost = checked
        .iter()
        .filter(|c| c.inspection.verdict == Verdict::Lost)
        .count();
    let held = checked
        .iter()
        .filter(|c| matches!(c.inspection.verdict, Verdict::HeldBack(_)))
        .count();
    eprintln!(
        "reconcile: {} consistent, {differing} with differences ({} repaired), {held} held back by work in flight, {lost} lost in Redis",
        checked
            .iter()
            .filter(|c| c.inspection.verdict == Verdict::Consistent)
            .count(),
        differing - unrepaired,
    );
    if lost > 0 {
        eprintln!("reconcile: rebuild lost buckets with `stocksvr bucket rebuild --all --execute`");
    }
    Ok(if unrepaired > 0 || lost > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn numbers(t: i64, a: i64, r: i64, s: i64, d: i64) -> String {
    format!("{t}/{a}/{r}/{s}/{d}")
}

/// One line per bucket: the three views as total/available/reserved/sold/deficit, the
/// snapshot, and the verdict.
fn print_table(checked: &[Checked]) {
    println!(
        "{:<36} {:>8} {:>26} {:>26} {:>26} {:>26}  VERDICT",
        "BUCKET",
        "VERSION",
        "REDIS t/a/r/s/d",
        "RESERVATIONS t/a/r/s/d",
        "LEDGER t/a/r/s/d",
        "SNAPSHOT t/a/r/s/d"
    );
    for c in checked {
        let v = &c.inspection.views;
        let (version, redis) = match v.redis {
            Some(r) => (
                r.version.to_string(),
                numbers(r.total, r.available, r.reserved, r.sold, r.deficit),
            ),
            None => ("-".into(), "missing".into()),
        };
        let e = v.expected;
        let l = v.ledger;
        let snapshot = v
            .snapshot
            .map(|s| numbers(s.total, s.available, s.reserved, s.sold, s.deficit))
            .unwrap_or_else(|| "missing".into());
        let verdict = match (&c.inspection.verdict, c.confirmed.is_empty(), &c.repair) {
            (Verdict::HeldBack(why), _, _) => format!(
                "held back: {}",
                why.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (Verdict::Differs(_), false, repair) => {
                let kinds: Vec<&str> = c.confirmed.iter().map(|k| k.name()).collect();
                let repair = match repair {
                    Some(RepairOutcome::Repaired { operation_id }) => {
                        format!(" -> REPAIRED ({operation_id})")
                    }
                    Some(other) => format!(" -> repair {other:?}"),
                    None => String::new(),
                };
                format!("DIFFERS: {}{repair}", kinds.join(", "))
            }
            (Verdict::Differs(_), true, _) => "moving (not seen twice at one version)".into(),
            (other, _, _) => verdict_name(other).to_string(),
        };
        println!(
            "{:<36} {:>8} {:>26} {:>26} {:>26} {:>26}  {verdict}",
            c.inspection.bucket.stock_bucket_id,
            version,
            redis,
            numbers(e.total, e.available, e.reserved, e.sold, e.deficit),
            numbers(l.total, l.available, l.reserved, l.sold, l.deficit),
            snapshot
        );
    }
}

/// `stocksvr bucket rebuild BUCKET | --all [--execute]`. Exit 0 when every bucket was
/// rebuilt and reopened (or, dry, when none is lost), 1 otherwise.
pub async fn rebuild(
    settings: &Settings,
    bucket: Option<String>,
    execute: bool,
    parallel: usize,
) -> anyhow::Result<ExitCode> {
    let parallel = parallel.clamp(1, 64);
    let reconciler = Arc::new(reconciler(settings, parallel as u32 * 2 + 2).await?);
    let filter = BucketFilter {
        bucket: bucket.clone(),
        ..BucketFilter::default()
    };
    let started = Instant::now();
    let lost: Vec<String> = reconciler
        .inspect_all(&filter, &progress)
        .await?
        .into_iter()
        .filter(|i| i.verdict == Verdict::Lost || i.bucket.lost_at.is_some())
        .map(|i| i.bucket.stock_bucket_id)
        .collect();
    eprintln!(
        "\rrebuild: {} lost bucket(s) found in {:.1} s",
        lost.len(),
        started.elapsed().as_secs_f64()
    );
    if let (Some(b), true) = (&bucket, lost.is_empty()) {
        eprintln!("rebuild: {b} is not lost (Redis has it): nothing to rebuild");
        return Ok(ExitCode::SUCCESS);
    }
    if !execute {
        for b in &lost {
            println!("{b}");
        }
        eprintln!("rebuild: dry run; add --execute to rebuild these");
        return Ok(ExitCode::SUCCESS);
    }
    // Phase 1: every bucket rebuilt (in parallel); phase 2: reopened together once their
    // events are booked and a pass finds them consistent.
    let started = Instant::now();
    let total = lost.len();
    let mut failures = Vec::new();
    let mut rebuilt = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut queue = lost.into_iter();
    loop {
        while tasks.len() < parallel {
            let Some(b) = queue.next() else { break };
            let reconciler = reconciler.clone();
            tasks.spawn(async move {
                let result = reconciler.rebuild_only(&b).await;
                (b, result)
            });
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let (b, result) = joined?;
        match result {
            Ok(view) if view.succeeded() => rebuilt.push((b, view.operation_id)),
            Ok(view) => {
                println!(
                    "{b}\t{}\tnot rebuilt\t{}\t{}",
                    view.status.to_lowercase(),
                    view.operation_id,
                    view.last_error.unwrap_or_default()
                );
                failures.push(b);
            }
            Err(e) => {
                println!("{b}\tfailed\t{e}");
                failures.push(b);
            }
        }
        let n = rebuilt.len() + failures.len();
        if n.is_multiple_of(500) || n == total {
            eprintln!(
                "rebuild: {n}/{total} rebuilt in {:.1} s ({} failed)",
                started.elapsed().as_secs_f64(),
                failures.len()
            );
        }
    }
    let rebuilt_in = started.elapsed();
    let ids: Vec<String> = rebuilt.iter().map(|(b, _)| b.clone()).collect();
    let reopened = reconciler
        .reopen_many(&ids, reconciler.config().reopen_timeout, &|n| {
            eprintln!("rebuild: {n}/{} reopened", ids.len())
        })
        .await?;
    let open: std::collections::HashSet<&String> = reopened.iter().collect();
    for (b, op) in &rebuilt {
        if open.contains(b) {
            println!("{b}\trebuilt\treopened\t{op}");
        } else {
            println!(
                "{b}\trebuilt\tnot reopened (not consistent yet; the reconciler reopens it)\t{op}"
            );
            failures.push(b.clone());
        }
    }
    eprintln!(
        "rebuild: {} of {total} rebuilt in {:.1} s, {} reopened after {:.1} s in all",
        rebuilt.len(),
        rebuilt_in.as_secs_f64(),
        reopened.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
