//! `stocksvr reconcile`: compares every bucket's three views, repairs with `--repair`.
//! Progress goes to stderr, the table or JSON to stdout.

use crate::connect::reconciler;
use clap::Args;
use std::process::ExitCode;
use std::time::Instant;
use stocksvr::Settings;
use stocksvr_core::codes::WalEffect;
use stocksvr_reconciler::classify::Verdict;
use stocksvr_reconciler::{verdict_name, BucketFilter, Checked, RepairOutcome};

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

/// The running count of buckets read, on stderr (every one up to 1,000, then per 1,000).
pub fn progress(n: usize) {
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
                        format!(" -> {} ({operation_id})", WalEffect::Repaired)
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
