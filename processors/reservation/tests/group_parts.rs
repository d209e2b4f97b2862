//! `stocksvr_try_group_part_seconds`: where a commit group's transaction spends its time.
//! Alone in its own test binary, so the process-wide metrics it reads are only its Trys'.

mod common;

use common::{series, Fixture};
use stocksvr_reservation::ServiceConfig;

/// Forty concurrent Trys queue behind one group writer, so most of them commit in groups.
/// Each group transaction that committed records its four parts once (a lone completion
/// takes the single-row path and records none), and the parts never add up to more than the
/// stage's write time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_commit_group_records_its_four_parts_once() {
    const TRYS: u64 = 40;
    let config = ServiceConfig {
        try_group_max: 64,
        try_groups_in_flight: 1,
        ..ServiceConfig::default()
    };
    let f = std::sync::Arc::new(Fixture::with_config(100, config).await);
    f.init_today(100).await;
    let metrics = stocksvr_pipeline::telemetry::init_metrics();
    let trys: Vec<_> = (1..=TRYS)
        .map(|item| {
            let f = f.clone();
            tokio::spawn(async move { f.service.try_reserve(&f.request(item, 1)).await })
        })
        .collect();
    for t in trys {
        let reply = t.await.expect("task").expect("try");
        assert_eq!(reply.reservation.status_name(), "RESERVED");
    }
    let text = metrics.render();
    let commit = "stage=\"commit\"";
    let groups = series(&text, "stocksvr_try_group_size_count", commit);
    let alone = series(
        &text,
        "stocksvr_try_group_size_bucket",
        "stage=\"commit\",le=\"1\"",
    );
    assert_eq!(
        series(&text, "stocksvr_try_group_size_sum", commit),
        TRYS as f64,
        "every Try completed through the commit stage: {text}"
    );
    assert!(
        groups - alone >= 1.0,
        "forty concurrent Trys made no commit group of two or more ({groups} groups, {alone} alone)"
    );
    let mut parts_sum = 0.0;
    for part in ["open", "cas", "outbox", "commit"] {
        let label = format!("part=\"{part}\"");
        assert_eq!(
            series(&text, "stocksvr_try_group_part_seconds_count", &label),
            groups - alone,
            "{part}: once per group transaction"
        );
        parts_sum += series(&text, "stocksvr_try_group_part_seconds_sum", &label);
    }
    let written = series(&text, "stocksvr_try_group_write_seconds_sum", commit);
    assert!(
        parts_sum > 0.0 && parts_sum <= written,
        "the parts ({parts_sum} s) fall within the commit stage's writes ({written} s)"
    );
}
