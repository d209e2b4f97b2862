//! `stocksvr bucket rebuild BUCKET | --all [--execute]`: finds the buckets Redis lost,
//! rebuilds them from MySQL (in parallel), then reopens them together once their events are
//! booked and a pass finds them consistent. Progress goes to stderr, one line per bucket to
//! stdout.

use crate::connect::reconciler;
use crate::reconcile_cmd::progress;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use stocksvr::Settings;
use stocksvr_reconciler::classify::Verdict;
use stocksvr_reconciler::{BucketFilter, Reconciler};

/// Exit 0 when every bucket was rebuilt and reopened (or, dry, when none is lost), 1
/// otherwise.
pub async fn rebuild(
    settings: &Settings,
    bucket: Option<String>,
    execute: bool,
    parallel: usize,
) -> anyhow::Result<ExitCode> {
    let parallel = parallel.clamp(1, 64);
    let reconciler = Arc::new(reconciler(settings, parallel as u32 * 2 + 2).await?);
    let lost = find_lost(&reconciler, bucket.clone()).await?;
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
    let Rebuilt {
        rebuilt,
        mut failures,
    } = rebuild_all(&reconciler, lost, parallel, started).await?;
    let rebuilt_in = started.elapsed();
    let reopened = reopen(&reconciler, &rebuilt, &mut failures).await?;
    eprintln!(
        "rebuild: {} of {total} rebuilt in {:.1} s, {reopened} reopened after {:.1} s in all",
        rebuilt.len(),
        rebuilt_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The buckets found lost (or still marked lost) among those `bucket` names (all: `None`).
async fn find_lost(reconciler: &Reconciler, bucket: Option<String>) -> anyhow::Result<Vec<String>> {
    let filter = BucketFilter {
        bucket,
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
    Ok(lost)
}

/// What phase 1 came to: the buckets rebuilt (with their operation ids) and those that were
/// not.
struct Rebuilt {
    rebuilt: Vec<(String, String)>,
    failures: Vec<String>,
}

/// Rebuilds `lost`, `parallel` at a time; a bucket not rebuilt gets its line on stdout now.
async fn rebuild_all(
    reconciler: &Arc<Reconciler>,
    lost: Vec<String>,
    parallel: usize,
    started: Instant,
) -> anyhow::Result<Rebuilt> {
    let total = lost.len();
    let mut out = Rebuilt {
        rebuilt: Vec::new(),
        failures: Vec::new(),
    };
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
            Ok(view) if view.succeeded() => out.rebuilt.push((b, view.operation_id)),
            Ok(view) => {
                println!(
                    "{b}\t{}\tnot rebuilt\t{}\t{}",
                    view.status.to_lowercase(),
                    view.operation_id,
                    view.last_error.unwrap_or_default()
                );
                out.failures.push(b);
            }
            Err(e) => {
                println!("{b}\tfailed\t{e}");
                out.failures.push(b);
            }
        }
        let n = out.rebuilt.len() + out.failures.len();
        if n.is_multiple_of(500) || n == total {
            eprintln!(
                "rebuild: {n}/{total} rebuilt in {:.1} s ({} failed)",
                started.elapsed().as_secs_f64(),
                out.failures.len()
            );
        }
    }
    Ok(out)
}

/// Reopens the `rebuilt` buckets together and prints each one's line; one not reopened in
/// time joins `failures`. Returns how many were reopened.
async fn reopen(
    reconciler: &Reconciler,
    rebuilt: &[(String, String)],
    failures: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let ids: Vec<String> = rebuilt.iter().map(|(b, _)| b.clone()).collect();
    let reopened = reconciler
        .reopen_many(&ids, reconciler.config().reopen_timeout, &|n| {
            eprintln!("rebuild: {n}/{} reopened", ids.len())
        })
        .await?;
    let open: std::collections::HashSet<&String> = reopened.iter().collect();
    for (b, op) in rebuilt {
        if open.contains(b) {
            println!("{b}\trebuilt\treopened\t{op}");
        } else {
            println!(
                "{b}\trebuilt\tnot reopened (not consistent yet; the reconciler reopens it)\t{op}"
            );
            failures.push(b.clone());
        }
    }
    Ok(reopened.len())
}
