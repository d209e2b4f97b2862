//! The inventory Lua scripts against a real Redis 7 (`scripts/stack up redis`, port 6380, or
//! `STOCKSVR__REDIS__URL`). Every test works in its own buckets: the merchant id is random per
//! test, so tests run in parallel in db 0 next to anything else, and each test deletes its keys.

use anyhow::{ensure, Context, Result};
use redis::aio::ConnectionManager;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::events::StockAfter;
use stocksvr_core::model::{OpCode, OpResult};
use stocksvr_store::lua::{ExecError, LuaExecutor, Step, StockNumbers, TryItem, DEFAULT_OP_TTL};
use stocksvr_store::RedisConn;

fn date() -> chrono::NaiveDate {
    chrono::NaiveDate::from_ymd_opt(2026, 7, 26).expect("valid date")
}

fn redis_url() -> String {
    std::env::var("STOCKSVR__REDIS__URL").unwrap_or_else(|_| "redis://127.0.0.1:6380/".into())
}

/// A merchant id no other test (or earlier run) uses: clock nanos, the pid and a counter.
fn fresh_merchant() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    (nanos ^ (u64::from(std::process::id()) << 40)).wrapping_add(n * 7_919) % 1_000_000_000_000
}

struct Ctx {
    exec: LuaExecutor,
    conn: RedisConn,
    merchant: u64,
}

impl Ctx {
    async fn new() -> Result<Self> {
        let conn = stocksvr_store::connect_redis(
            &stocksvr_store::RedisTarget::from_env(&redis_url()).expect("redis settings"),
            Duration::from_secs(10),
        )
        .await
        .context("redis at 127.0.0.1:6380 (scripts/stack up redis)")?;
        Ok(Self {
            exec: LuaExecutor::new(conn.clone(), DEFAULT_OP_TTL),
            conn,
            merchant: fresh_merchant(),
        })
    }

    fn bucket(&self, dish: u64) -> BucketKey {
        BucketKey::new(self.merchant, dish, date())
    }

    /// A bucket of `total`, OPEN, version 1.
    async fn open_bucket(&self, dish: u64, total: i64) -> Result<BucketKey> {
        let keys = self.bucket(dish);
        let r = self.exec.init_bucket(&keys, "init", total, 1).await?;
        ensure!(r.code == OpCode::Succeeded && r.version == 1, "{r:?}");
        Ok(keys)
    }

    async fn numbers(&self, keys: &BucketKey) -> Result<StockNumbers> {
        self.exec.read_bucket(keys).await?.context("bucket exists")
    }

    async fn exists(&self, key: &str) -> Result<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await?;
        Ok(n == 1)
    }

    /// Deletes every key of this test's merchant.
    async fn cleanup(&self) -> Result<()> {
        // SCAN walks one node's keyspace; on a cluster the keys stay behind under this test's
        // own merchant, and the private cluster of scripts/redis-cluster-test goes with its run.
        if self.conn.is_cluster() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let pattern = format!("inv:{{{}:*", self.merchant);
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

fn assert_conserved(n: &StockNumbers) {
    assert_after_conserved(&StockAfter {
        total: n.total,
        available: n.available,
        reserved: n.reserved,
        sold: n.sold,
    });
}

fn assert_after_conserved(n: &StockAfter) {
    assert!(
        n.available >= 0 && n.reserved >= 0 && n.sold >= 0,
        "negative numbers: {n:?}"
    );
    assert_eq!(
        n.available + n.reserved + n.sold,
        n.total,
        "not conserved: {n:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_trys_never_oversell() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 500).await?;

    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..2_000u64 {
        let exec = ctx.exec.clone();
        tasks.push(tokio::spawn(async move {
            let qty = (i % 3 + 1) as u32;
            let r = exec
                .step(
                    &keys,
                    1_000 + i,
                    &format!("try-{i}"),
                    Step::Try { quantity: qty },
                )
                .await;
            (qty, r)
        }));
    }
    let mut granted = 0i64;
    let mut succeeded = 0;
    let mut insufficient = 0;
    for task in tasks {
        let (qty, r) = task.await?;
        let r = r?;
        assert!(!r.replayed);
        assert_after_conserved(&r.after);
        match r.code {
            OpCode::Succeeded => {
                granted += i64::from(qty);
                succeeded += 1;
            }
            OpCode::Insufficient => insufficient += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    println!(
        "2000 concurrent Trys over one ConnectionManager: {:.0} ops/s ({elapsed:?}; {succeeded} succeeded, {insufficient} insufficient)",
        2_000.0 / elapsed.as_secs_f64()
    );

    let n = ctx.numbers(&keys).await?;
    assert_conserved(&n);
    assert!(granted <= 500);
    assert_eq!(n.reserved, granted);
    assert_eq!(n.sold, 0);
    // Demand (~4000) far exceeds supply, and every third Try asks for 1: nothing is left over.
    assert_eq!(n.available, 0);
    // One version per successful Try, on top of the init's version 1.
    assert_eq!(n.version, 1 + succeeded);
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_try_sent_50_times_applies_once() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 10).await?;

    let mut tasks = Vec::new();
    for _ in 0..50 {
        let exec = ctx.exec.clone();
        tasks.push(tokio::spawn(async move {
            exec.step(&keys, 77, "try-77", Step::Try { quantity: 3 })
                .await
        }));
    }
    let mut results: Vec<OpResult> = Vec::new();
    for task in tasks {
        results.push(task.await??);
    }
    let replayed = results.iter().filter(|r| r.replayed).count();
    assert_eq!(replayed, 49);
    let first = results
        .iter()
        .find(|r| !r.replayed)
        .cloned()
        .context("one original")?;
    assert_eq!(first.code, OpCode::Succeeded);
    assert_eq!(first.fence.name(), "RESERVED");
    for r in &results {
        assert_eq!(
            OpResult {
                replayed: false,
                ..*r
            },
            first
        );
    }
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.available, n.reserved, n.version), (7, 3, 2));
    ctx.cleanup().await
}

/// The fence-only Cancel of a Try that gives up its row (its bucket was lost): it fences a
/// reservation no Try holds, with or without the stock hash, but leaves one another copy of
/// the Try holds as it is and records nothing, so the real Cancel of that reservation, with
/// the same operation id, still releases it.
#[tokio::test]
async fn a_fence_only_cancel_fences_an_unheld_reservation_and_leaves_a_held_one() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 10).await?;
    let t = ctx
        .exec
        .step(&keys, 7, "try-7", Step::Try { quantity: 2 })
        .await?;
    assert_eq!(t.code, OpCode::Succeeded);
    let held = ctx.numbers(&keys).await?;
    let fence = ctx.exec.read_fence(&keys, 7).await?.context("fence")?;

    let f = ctx
        .exec
        .step(&keys, 7, "cancel-7", Step::FenceTry { quantity: 2 })
        .await?;
    assert_eq!((f.code, f.fence.name()), (OpCode::Conflict, "RESERVED"));
    assert_eq!(ctx.numbers(&keys).await?, held, "nothing released");
    assert_eq!(
        ctx.exec.read_fence(&keys, 7).await?.context("fence")?,
        fence
    );
    assert_eq!(
        ctx.exec.read_op(&keys, "cancel-7").await?,
        None,
        "nothing recorded under the Cancel's id"
    );
    let c = ctx
        .exec
        .step(
            &keys,
            7,
            "cancel-7",
            Step::Cancel {
                quantity: 2,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(c.code, OpCode::Succeeded);
    assert!(!c.empty_rollback && !c.replayed, "{c:?}");
    assert_eq!(
        ctx.numbers(&keys).await?.reserved,
        0,
        "the real Cancel released it"
    );

    // No Try holds reservation 8: fenced, an empty rollback; its late Try is refused.
    let f = ctx
        .exec
        .step(&keys, 8, "cancel-8", Step::FenceTry { quantity: 1 })
        .await?;
    assert_eq!((f.code, f.fence.name()), (OpCode::Succeeded, "CANCELED"));
    assert!(f.empty_rollback);
    let late = ctx
        .exec
        .step(&keys, 8, "try-8", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(late.code, OpCode::Fenced);

    // Without the stock hash (the bucket lost) the fence is written all the same.
    let lost = ctx.bucket(2);
    let f = ctx
        .exec
        .step(&lost, 9, "cancel-9", Step::FenceTry { quantity: 1 })
        .await?;
    assert_eq!((f.code, f.fence.name()), (OpCode::Succeeded, "CANCELED"));
    ctx.cleanup().await
}

#[tokio::test]
async fn cancel_before_try_is_an_empty_rollback_and_fences_the_late_try() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 10).await?;
    let before = ctx.numbers(&keys).await?;

    let c = ctx
        .exec
        .step(
            &keys,
            5,
            "cancel-5",
            Step::Cancel {
                quantity: 2,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(c.code, OpCode::Succeeded);
    assert!(c.empty_rollback && !c.replayed);
    assert_eq!(c.fence.name(), "CANCELED");
    assert_eq!(
        ctx.numbers(&keys).await?,
        before,
        "an empty rollback adds no stock"
    );
    let fence = ctx.exec.read_fence(&keys, 5).await?.context("fence")?;
    assert_eq!(fence.fence.phase.name(), "CANCELED");
    assert_eq!(fence.fence.quantity, 2);
    assert_eq!(fence.cancel_op.as_deref(), Some("cancel-5"));
    assert_eq!(fence.try_op, None);

    // The Try that was in flight arrives now (hanging): fenced, nothing moves.
    let t = ctx
        .exec
        .step(&keys, 5, "try-5", Step::Try { quantity: 2 })
        .await?;
    assert_eq!(t.code, OpCode::Fenced);
    assert_eq!(ctx.numbers(&keys).await?, before);
    assert_eq!(
        ctx.exec.read_fence(&keys, 5).await?.context("fence")?,
        fence
    );

    // A retry of the same Try, and a second Cancel with another id: first results / no change.
    let t2 = ctx
        .exec
        .step(&keys, 5, "try-5", Step::Try { quantity: 2 })
        .await?;
    assert_eq!((t2.code, t2.replayed), (OpCode::Fenced, true));
    let c2 = ctx
        .exec
        .step(
            &keys,
            5,
            "cancel-5-again",
            Step::Cancel {
                quantity: 2,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(c2.code, OpCode::Succeeded);
    assert!(c2.empty_rollback && !c2.replayed);
    let c3 = ctx
        .exec
        .step(
            &keys,
            5,
            "cancel-5",
            Step::Cancel {
                quantity: 2,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(
        c3,
        OpResult {
            replayed: true,
            ..c
        }
    );
    assert_eq!(ctx.numbers(&keys).await?, before);

    // Cancel with no bucket: for a bucket that was built, Redis lost it with its fences, so
    // nothing is judged (a missing fence there does not mean "the Try never ran").
    let missing = ctx.bucket(2);
    let lost = ctx
        .exec
        .step(
            &missing,
            6,
            "cancel-6",
            Step::Cancel {
                quantity: 1,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(lost.code, OpCode::BucketMissing);
    assert!(
        ctx.exec.read_fence(&missing, 6).await?.is_none(),
        "nothing written"
    );
    // For a bucket MySQL knows was never built it still fences: a Try waiting for a lazy
    // init must not freeze stock after it.
    let c = ctx
        .exec
        .step(
            &missing,
            6,
            "cancel-6",
            Step::Cancel {
                quantity: 1,
                never_built: true,
            },
        )
        .await?;
    assert!((c.code == OpCode::Succeeded) && c.empty_rollback);
    assert!(
        !ctx.exists(&missing.stock_key()).await?,
        "cancel never creates the bucket"
    );
    ctx.exec.init_bucket(&missing, "init-2", 4, 1).await?;
    let t = ctx
        .exec
        .step(&missing, 6, "try-6", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(t.code, OpCode::Fenced);
    assert_eq!(ctx.numbers(&missing).await?.available, 4);
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirm_and_cancel_race_and_exactly_one_wins() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 1_000).await?;
    let mut qty_of = Vec::new();
    for r in 0..200u64 {
        let qty = (r % 3 + 1) as u32;
        let t = ctx
            .exec
            .step(&keys, r, &format!("try-{r}"), Step::Try { quantity: qty })
            .await?;
        ensure!((t.code == OpCode::Succeeded), "{t:?}");
        qty_of.push(qty);
    }

    let mut tasks = Vec::new();
    for r in 0..200u64 {
        let (e1, e2) = (ctx.exec.clone(), ctx.exec.clone());
        let (k1, k2) = (keys, keys);
        let qty = qty_of[r as usize];
        // Alternate which call is issued first so both outcomes of the race get exercised.
        let (confirm, cancel) = if r % 2 == 0 {
            let confirm = tokio::spawn(async move {
                e1.step(&k1, r, &format!("confirm-{r}"), Step::Confirm)
                    .await
            });
            let cancel = tokio::spawn(async move {
                e2.step(
                    &k2,
                    r,
                    &format!("cancel-{r}"),
                    Step::Cancel {
                        quantity: qty,
                        never_built: false,
                    },
                )
                .await
            });
            (confirm, cancel)
        } else {
            let cancel = tokio::spawn(async move {
                e2.step(
                    &k2,
                    r,
                    &format!("cancel-{r}"),
                    Step::Cancel {
                        quantity: qty,
                        never_built: false,
                    },
                )
                .await
            });
            let confirm = tokio::spawn(async move {
                e1.step(&k1, r, &format!("confirm-{r}"), Step::Confirm)
                    .await
            });
            (confirm, cancel)
        };
        tasks.push((r, confirm, cancel));
    }
    let mut sold = 0i64;
    let mut returned = 0i64;
    for (r, confirm, cancel) in tasks {
        let (confirm, cancel) = (confirm.await??, cancel.await??);
        let qty = i64::from(qty_of[r as usize]);
        match (confirm.code, cancel.code) {
            (OpCode::Succeeded, OpCode::Conflict) => {
                assert_eq!(cancel.fence.name(), "CONFIRMED");
                sold += qty;
            }
            (OpCode::Conflict, OpCode::Succeeded) => {
                assert_eq!(confirm.fence.name(), "CANCELED");
                assert!(!cancel.empty_rollback);
                returned += qty;
            }
            other => panic!("reservation {r}: both or neither won: {other:?}"),
        }
    }
    let n = ctx.numbers(&keys).await?;
    assert_conserved(&n);
    assert_eq!(n.reserved, 0);
    assert_eq!(n.sold, sold);
    assert_eq!(n.available, 1_000 - sold);
    // Which side wins is up to the scheduler; the invariants above hold either way. The
    // split is printed so a run that only ever exercised one side is visible.
    eprintln!("confirm won {sold} units, cancel won {returned} units");
    ctx.cleanup().await
}

#[tokio::test]
async fn refunds() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 20).await?;

    // From CONFIRMED: sold -> available, partial refunds add up, then REFUNDED.
    ctx.exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 5 })
        .await?;
    ctx.exec.step(&keys, 1, "confirm-1", Step::Confirm).await?;
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.available, n.reserved, n.sold), (15, 0, 5));

    let r1 = ctx
        .exec
        .step(&keys, 1, "refund-1a", Step::Refund { quantity: 2 })
        .await?;
    assert_eq!(r1.code, OpCode::Succeeded);
    assert_eq!(
        r1.fence.name(),
        "CONFIRMED",
        "a partial refund keeps the phase"
    );
    assert_eq!((r1.after.available, r1.after.sold), (17, 3));

    // The same refund op again: the first result, nothing moves.
    let again = ctx
        .exec
        .step(&keys, 1, "refund-1a", Step::Refund { quantity: 2 })
        .await?;
    assert_eq!(
        again,
        OpResult {
            replayed: true,
            ..r1
        }
    );
    assert_eq!(ctx.numbers(&keys).await?.sold, 3);

    // More than what is left: rejected, no change; and recorded as such.
    let over = ctx
        .exec
        .step(&keys, 1, "refund-1b", Step::Refund { quantity: 4 })
        .await?;
    assert_eq!(over.code, OpCode::OverRefund);
    assert_eq!(ctx.numbers(&keys).await?.sold, 3);
    let over_again = ctx
        .exec
        .step(&keys, 1, "refund-1b", Step::Refund { quantity: 4 })
        .await?;
    assert_eq!(
        (over_again.code, over_again.replayed),
        (OpCode::OverRefund, true)
    );

    let r2 = ctx
        .exec
        .step(&keys, 1, "refund-1c", Step::Refund { quantity: 1 })
        .await?;
    assert_eq!(r2.fence.name(), "CONFIRMED");
    let r3 = ctx
        .exec
        .step(&keys, 1, "refund-1d", Step::Refund { quantity: 2 })
        .await?;
    assert_eq!(r3.fence.name(), "REFUNDED");
    assert_eq!((r3.after.available, r3.after.sold), (20, 0));
    let fence = ctx.exec.read_fence(&keys, 1).await?.context("fence")?;
    assert_eq!(
        (fence.fence.phase.name(), fence.fence.refunded),
        ("REFUNDED", 5)
    );
    let nothing_left = ctx
        .exec
        .step(&keys, 1, "refund-1e", Step::Refund { quantity: 1 })
        .await?;
    assert_eq!(nothing_left.code, OpCode::Conflict);
    // A late Try of a refunded reservation is fenced too.
    let late = ctx
        .exec
        .step(&keys, 1, "try-1-late", Step::Try { quantity: 5 })
        .await?;
    assert_eq!(late.code, OpCode::Fenced);

    // From RESERVED (a scheduled order refunded before its confirm time): reserved -> available.
    ctx.exec
        .step(&keys, 2, "try-2", Step::Try { quantity: 4 })
        .await?;
    let r = ctx
        .exec
        .step(&keys, 2, "refund-2a", Step::Refund { quantity: 1 })
        .await?;
    assert_eq!(r.fence.name(), "RESERVED");
    assert_eq!((r.after.available, r.after.reserved), (17, 3));
    // Confirming the rest sells only what was not refunded.
    let c = ctx.exec.step(&keys, 2, "confirm-2", Step::Confirm).await?;
    assert_eq!(
        (c.after.available, c.after.reserved, c.after.sold),
        (17, 0, 3)
    );
    let r = ctx
        .exec
        .step(&keys, 2, "refund-2b", Step::Refund { quantity: 3 })
        .await?;
    assert_eq!(r.fence.name(), "REFUNDED");
    assert_eq!((r.after.available, r.after.sold), (20, 0));

    // Whole refund straight from RESERVED.
    ctx.exec
        .step(&keys, 3, "try-3", Step::Try { quantity: 2 })
        .await?;
    let r = ctx
        .exec
        .step(&keys, 3, "refund-3", Step::Refund { quantity: 2 })
        .await?;
    assert_eq!(r.fence.name(), "REFUNDED");
    assert_eq!(r.after.reserved, 0);

    // Refund of a reservation that never reserved, or was cancelled: conflict, no change.
    let none = ctx
        .exec
        .step(&keys, 4, "refund-4", Step::Refund { quantity: 1 })
        .await?;
    assert_eq!(none.code, OpCode::Conflict);
    ctx.exec
        .step(&keys, 5, "try-5", Step::Try { quantity: 1 })
        .await?;
    ctx.exec
        .step(
            &keys,
            5,
            "cancel-5",
            Step::Cancel {
                quantity: 1,
                never_built: false,
            },
        )
        .await?;
    let canceled = ctx
        .exec
        .step(&keys, 5, "refund-5", Step::Refund { quantity: 1 })
        .await?;
    assert_eq!(canceled.code, OpCode::Conflict);
    let cancel_after_confirm = ctx
        .exec
        .step(
            &keys,
            2,
            "cancel-2",
            Step::Cancel {
                quantity: 4,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(cancel_after_confirm.code, OpCode::Conflict);

    let n = ctx.numbers(&keys).await?;
    assert_conserved(&n);
    assert_eq!(n.available, 20);
    ctx.cleanup().await
}

#[tokio::test]
async fn init_bucket_is_idempotent_and_never_overwrites_a_traded_bucket() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.bucket(1);

    let first = ctx.exec.init_bucket(&keys, "init-a", 10, 3).await?;
    assert_eq!(first.code, OpCode::Succeeded);
    assert_eq!(
        (first.version, first.after),
        (
            1,
            StockAfter {
                total: 10,
                available: 10,
                reserved: 0,
                sold: 0
            }
        )
    );
    let stored = ctx.exec.read_bucket(&keys).await?.context("bucket")?;
    assert_eq!(
        (stored.state, stored.baseline_version, stored.deficit),
        (BucketState::Open, 3, 0)
    );

    // Replay of the same op, then concurrent lazy inits with other ids: no change.
    let replay = ctx.exec.init_bucket(&keys, "init-a", 10, 3).await?;
    assert_eq!(
        replay,
        OpResult {
            replayed: true,
            ..first
        }
    );
    let same = ctx.exec.init_bucket(&keys, "init-b", 99, 3).await?;
    assert_eq!((same.code, same.after), (OpCode::Succeeded, first.after));
    let older = ctx.exec.init_bucket(&keys, "init-c", 99, 2).await?;
    assert_eq!((older.code, older.after), (OpCode::Succeeded, first.after));

    assert!(first.created);
    assert!(!same.created);

    // An existing bucket is never rebuilt by an init, whatever its baseline: a newer total
    // reaches it through adjust, which books the difference, not the whole total again.
    let newer = ctx.exec.init_bucket(&keys, "init-d", 12, 4).await?;
    assert_eq!(
        (newer.code, newer.after, newer.created),
        (OpCode::Succeeded, first.after, false)
    );
    ctx.exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 2 })
        .await?;
    let traded = ctx.exec.init_bucket(&keys, "init-e", 50, 5).await?;
    assert_eq!(traded.code, OpCode::Succeeded);
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.total, n.available, n.reserved), (10, 8, 2));

    // Concurrent inits of a fresh bucket converge on one creation.
    let fresh = ctx.bucket(2);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let exec = ctx.exec.clone();
        let keys = fresh;
        tasks.push(tokio::spawn(async move {
            exec.init_bucket(&keys, &format!("lazy-{i}"), 30, 1).await
        }));
    }
    for task in tasks {
        let r = task.await??;
        assert_eq!(r.code, OpCode::Succeeded);
        assert_eq!(r.version, 1);
    }
    ctx.cleanup().await
}

#[tokio::test]
async fn adjust_below_committed_gives_a_deficit_that_returns_pay_down() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 100).await?;
    // total 100: reserved 10, sold 20, available 70 (docs/design.md, adjustments and deficit).
    ctx.exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 20 })
        .await?;
    ctx.exec.step(&keys, 1, "confirm-1", Step::Confirm).await?;
    ctx.exec
        .step(&keys, 2, "try-2", Step::Try { quantity: 10 })
        .await?;
    let v = ctx.numbers(&keys).await?.version;

    let up = ctx.exec.adjust(&keys, "adj-1", 120, Some(v), 1).await?;
    assert_eq!(up.code, OpCode::Succeeded);
    assert_eq!(
        (
            up.after.total,
            up.after.available,
            up.after.reserved,
            up.after.sold
        ),
        (120, 90, 10, 20)
    );
    assert_eq!(up.deficit, 0);

    // A CAS on a stale version loses; a replay of the winner returns its first result.
    let stale = ctx.exec.adjust(&keys, "adj-2", 50, Some(v), 1).await?;
    assert_eq!(stale.code, OpCode::Conflict);
    assert_eq!(ctx.numbers(&keys).await?.total, 120);
    let replay = ctx.exec.adjust(&keys, "adj-1", 120, Some(v), 1).await?;
    assert_eq!(
        replay,
        OpResult {
            replayed: true,
            ..up
        }
    );

    // Below reserved + sold: available 0, deficit reported, nothing taken from accepted orders.
    let down = ctx.exec.adjust(&keys, "adj-3", 20, None, 2).await?;
    assert_eq!(down.code, OpCode::Succeeded);
    assert_eq!(
        (
            down.after.total,
            down.after.available,
            down.after.reserved,
            down.after.sold
        ),
        (20, 0, 10, 20)
    );
    assert_eq!(down.deficit, 10);
    let t = ctx
        .exec
        .step(&keys, 3, "try-3", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(t.code, OpCode::Insufficient);

    // Returned stock pays the deficit first: available + reserved + sold == total + deficit.
    let c = ctx
        .exec
        .step(
            &keys,
            2,
            "cancel-2",
            Step::Cancel {
                quantity: 10,
                never_built: false,
            },
        )
        .await?;
    assert_eq!(
        (c.after.available, c.after.reserved, c.after.sold, c.deficit),
        (0, 0, 20, 0)
    );
    let r = ctx
        .exec
        .step(&keys, 1, "refund-1", Step::Refund { quantity: 5 })
        .await?;
    assert_eq!((r.after.available, r.after.sold, r.deficit), (5, 15, 0));
    assert_conserved(&ctx.numbers(&keys).await?);

    // An adjust with an older baseline than the stored one is stale.
    let old = ctx.exec.adjust(&keys, "adj-4", 500, None, 1).await?;
    assert_eq!(old.code, OpCode::Conflict);
    ctx.cleanup().await
}

#[tokio::test]
async fn missing_and_closed_buckets() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.bucket(1);

    // Missing: nothing recorded, so the same op works after the (lazy) init.
    let t = ctx
        .exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(t.code, OpCode::BucketMissing);
    assert!(!ctx.exists(&keys.op_key("try-1")).await?);
    assert!(
        !ctx.exists(&keys.stock_key()).await?,
        "a script never creates a bucket by accident"
    );
    for r in [
        ctx.exec.adjust(&keys, "adj", 5, None, 1).await?,
        ctx.exec
            .set_state(&keys, "close", BucketState::Closed, None)
            .await?,
    ] {
        assert_eq!(r.code, OpCode::BucketMissing);
    }
    ctx.exec.init_bucket(&keys, "init", 5, 1).await?;
    let t = ctx
        .exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 1 })
        .await?;
    assert_eq!((t.code, t.replayed), (OpCode::Succeeded, false));
    ctx.exec
        .step(&keys, 2, "try-2", Step::Try { quantity: 1 })
        .await?;

    // Closed: no new Trys (not recorded), but existing reservations confirm and cancel.
    let closed = ctx
        .exec
        .set_state(&keys, "close", BucketState::Closed, None)
        .await?;
    assert_eq!(closed.code, OpCode::Succeeded);
    let t = ctx
        .exec
        .step(&keys, 3, "try-3", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(t.code, OpCode::BucketClosed);
    assert!(!ctx.exists(&keys.op_key("try-3")).await?);
    assert!(
        ctx.exec
            .step(&keys, 1, "confirm-1", Step::Confirm)
            .await?
            .code
            == OpCode::Succeeded
    );

    // Archiving waits for the reservations; reopening is refused.
    let early = ctx
        .exec
        .set_state(&keys, "archive-early", BucketState::Archived, None)
        .await?;
    assert_eq!(early.code, OpCode::Conflict);
    let reopen = ctx
        .exec
        .set_state(&keys, "reopen", BucketState::Open, None)
        .await?;
    assert_eq!(reopen.code, OpCode::Conflict);
    assert!(
        ctx.exec
            .step(
                &keys,
                2,
                "cancel-2",
                Step::Cancel {
                    quantity: 1,
                    never_built: false
                }
            )
            .await?
            .code
            == OpCode::Succeeded
    );
    let archived = ctx
        .exec
        .set_state(
            &keys,
            "archive",
            BucketState::Archived,
            Some(Duration::from_secs(3_600)),
        )
        .await?;
    assert_eq!(archived.code, OpCode::Succeeded);
    let stored = ctx.exec.read_bucket(&keys).await?.context("bucket")?;
    assert_eq!(stored.state, BucketState::Archived);
    let mut conn = ctx.conn.clone();
    let ttl: i64 = redis::cmd("TTL")
        .arg(keys.stock_key())
        .query_async(&mut conn)
        .await?;
    assert!((3_500..=3_600).contains(&ttl), "ttl {ttl}");
    let adj = ctx.exec.adjust(&keys, "adj-late", 9, None, 1).await?;
    assert_eq!(adj.code, OpCode::BucketClosed);
    // A refund of a sale still lands in its own day.
    let r = ctx
        .exec
        .step(&keys, 1, "refund-1", Step::Refund { quantity: 1 })
        .await?;
    assert_eq!((r.code, r.after.available), (OpCode::Succeeded, 5));
    ctx.cleanup().await
}

#[tokio::test]
async fn fences_and_op_records_expire_but_a_reserved_fence_does_not() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 5).await?;
    let conn = ctx.conn.clone();
    let pttl = |key: String| {
        let mut conn = conn.clone();
        async move {
            let t: i64 = redis::cmd("PTTL").arg(key).query_async(&mut conn).await?;
            anyhow::Ok(t)
        }
    };
    ctx.exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(
        pttl(keys.fence_key(1)).await?,
        -1,
        "a RESERVED fence must not expire"
    );
    let op_ttl = pttl(keys.op_key("try-1")).await?;
    let month = DEFAULT_OP_TTL.as_millis() as i64;
    assert!(op_ttl > month - 60_000 && op_ttl <= month, "{op_ttl}");
    ctx.exec.step(&keys, 1, "confirm-1", Step::Confirm).await?;
    assert!(pttl(keys.fence_key(1)).await? > month - 60_000);
    ctx.cleanup().await
}

#[tokio::test]
async fn replays_survive_an_expired_op_record_through_the_fence() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 5).await?;
    let t = ctx
        .exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 2 })
        .await?;
    let mut conn = ctx.conn.clone();
    let _: i64 = redis::cmd("DEL")
        .arg(keys.op_key("try-1"))
        .query_async(&mut conn)
        .await?;
    let again = ctx
        .exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 2 })
        .await?;
    assert_eq!((again.code, again.replayed), (OpCode::Succeeded, true));
    assert_eq!(again.after, t.after, "nothing moved twice");
    ctx.cleanup().await
}

/// What a result or an error says, without the operation id an error names and the script
/// position Redis appends to a lone call's error.
fn outcome(r: &Result<OpResult, ExecError>) -> String {
    match r {
        Ok(r) => format!("{r:?}"),
        Err(ExecError::Rejected { source, .. }) => {
            let text = source.to_string();
            let message = text.split(" script: ").next().unwrap_or_default();
            format!("rejected: {message}")
        }
        Err(e) => format!("other error: {e}"),
    }
}

#[tokio::test]
async fn a_group_of_trys_in_one_call_answers_each_as_its_own_call_would() -> Result<()> {
    let ctx = Ctx::new().await?;
    // (reservation, operation, quantity), in order: a fresh Try, a replay of an earlier one,
    // an operation id reused for another reservation, one that finds too little stock, one
    // that takes the rest, and a second Try of a held reservation under another id.
    let plan: [(u64, &str, u32); 6] = [
        (2, "op-b", 2),
        (1, "op-a", 1),
        (3, "op-a", 1),
        (4, "op-d", 3),
        (5, "op-e", 2),
        (2, "op-b2", 2),
    ];
    let items: Vec<TryItem> = plan
        .iter()
        .map(|&(reservation_id, op, quantity)| TryItem {
            reservation_id,
            operation_id: op.to_string(),
            quantity,
        })
        .collect();
    // The same history in two buckets: one Try of reservation 1 first, then the plan as lone
    // calls in one bucket and as one group call in the other.
    let alone = ctx.open_bucket(1, 5).await?;
    let grouped = ctx.open_bucket(2, 5).await?;
    for keys in [&alone, &grouped] {
        ctx.exec
            .step(keys, 1, "op-a", Step::Try { quantity: 1 })
            .await?;
    }
    let mut expected = Vec::new();
    for item in &items {
        let step = Step::Try {
            quantity: item.quantity,
        };
        expected.push(
            ctx.exec
                .step(&alone, item.reservation_id, &item.operation_id, step)
                .await,
        );
    }
    let got = ctx.exec.try_group(&grouped, &items).await;
    assert_eq!(got.len(), items.len());
    for ((item, want), got) in items.iter().zip(&expected).zip(&got) {
        assert_eq!(outcome(got), outcome(want), "item {item:?}");
        if let Err(e) = got {
            assert_eq!(e.operation_id(), item.operation_id, "{e}");
        }
    }
    let codes: Vec<String> = got
        .iter()
        .map(|r| match r {
            Ok(r) => format!("{:?}{}", r.code, if r.replayed { " replayed" } else { "" }),
            Err(_) => "refused".into(),
        })
        .collect();
    assert_eq!(
        codes,
        [
            "Succeeded",
            "Succeeded replayed",
            "refused",
            "Insufficient",
            "Succeeded",
            "Succeeded"
        ]
    );
    let (a, g) = (ctx.numbers(&alone).await?, ctx.numbers(&grouped).await?);
    assert_eq!((g.available, g.reserved, g.version), (0, 5, 4));
    assert_eq!(
        (a.available, a.reserved, a.version),
        (g.available, g.reserved, g.version)
    );
    // Bad arguments are refused before the call, for every item.
    let zero = [TryItem {
        reservation_id: 9,
        operation_id: "op-z".into(),
        quantity: 0,
    }];
    let refused = ctx
        .exec
        .try_group(&grouped, &[items[0].clone(), zero[0].clone()])
        .await;
    assert!(
        refused
            .iter()
            .all(|r| matches!(r, Err(ExecError::InvalidArgument(_)))),
        "{refused:?}"
    );
    assert_eq!(ctx.numbers(&grouped).await?.version, 4);
    ctx.cleanup().await
}

#[tokio::test]
async fn bad_calls_are_refused_without_effect() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 5).await?;
    ctx.exec
        .step(&keys, 1, "op-x", Step::Try { quantity: 1 })
        .await?;
    // One operation id for two reservations is a caller bug: refused, not answered for the other.
    let reused = ctx
        .exec
        .step(&keys, 2, "op-x", Step::Try { quantity: 1 })
        .await;
    assert!(
        matches!(reused, Err(ExecError::Rejected { .. })),
        "{reused:?}"
    );
    let reused = ctx
        .exec
        .step(
            &keys,
            1,
            "op-x",
            Step::Cancel {
                quantity: 1,
                never_built: false,
            },
        )
        .await;
    assert!(
        matches!(reused, Err(ExecError::Rejected { .. })),
        "{reused:?}"
    );
    assert!(matches!(
        ctx.exec
            .step(&keys, 3, "op-y", Step::Try { quantity: 0 })
            .await,
        Err(ExecError::InvalidArgument(_))
    ));
    assert!(matches!(
        ctx.exec.init_bucket(&keys, "op-z", -1, 1).await,
        Err(ExecError::InvalidArgument(_))
    ));
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.available, n.reserved, n.version), (4, 1, 2));
    ctx.cleanup().await
}

#[tokio::test]
async fn script_flush_in_the_middle_reloads_on_noscript() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 10).await?;
    assert!(
        ctx.exec
            .step(&keys, 1, "try-1", Step::Try { quantity: 1 })
            .await?
            .code
            == OpCode::Succeeded
    );
    let mut conn = ctx.conn.clone();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await?;
    let r = ctx
        .exec
        .step(&keys, 2, "try-2", Step::Try { quantity: 1 })
        .await?;
    assert!((r.code == OpCode::Succeeded) && !r.replayed);
    assert_eq!(ctx.numbers(&keys).await?.reserved, 2);
    ctx.cleanup().await
}

#[tokio::test]
async fn a_closed_port_gives_an_unknown_outcome() -> Result<()> {
    let client = redis::Client::open("redis://127.0.0.1:1/")?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    // Lazy: the connection is first attempted by the call, as after a Redis restart.
    let conn = ConnectionManager::new_lazy_with_config(client, config)?;
    let exec = LuaExecutor::new(conn, DEFAULT_OP_TTL);
    let keys = BucketKey::new(1, 2, date());
    let err = exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 1 })
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_unknown(), "{err:?}");
    match &err {
        ExecError::Unknown { operation_id, .. } => assert_eq!(operation_id, "try-1"),
        other => panic!("{other:?}"),
    }
    assert!(exec
        .read_bucket(&keys)
        .await
        .expect_err("no server")
        .is_unknown());
    Ok(())
}

#[tokio::test]
async fn a_repair_with_a_version_floor_moves_a_regressed_bucket_past_it() -> Result<()> {
    use stocksvr_store::lua::{RepairMode, TargetNumbers};
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 10).await?;
    ctx.exec
        .step(&keys, 1, "try-1", Step::Try { quantity: 2 })
        .await?;
    let at = ctx.numbers(&keys).await?.version;
    // Without a floor: the usual +1.
    let target = TargetNumbers::from_accepted(10, 2, 0);
    let r = ctx
        .exec
        .repair(
            &keys,
            "repair-1",
            RepairMode::Repair {
                expected_version: at,
                min_version: 0,
            },
            target,
        )
        .await?;
    assert_eq!((r.code, r.version), (OpCode::Succeeded, at + 1));
    // A bucket whose version went backwards (MySQL booked up to at + 20): the repair jumps.
    let target = TargetNumbers::from_accepted(10, 3, 0);
    let r = ctx
        .exec
        .repair(
            &keys,
            "repair-2",
            RepairMode::Repair {
                expected_version: at + 1,
                min_version: at + 21,
            },
            target,
        )
        .await?;
    assert_eq!((r.code, r.version), (OpCode::Succeeded, at + 21));
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.available, n.reserved, n.version), (7, 3, at + 21));
    assert_conserved(&n);
    // The next step continues from there.
    let t = ctx
        .exec
        .step(&keys, 2, "try-2", Step::Try { quantity: 1 })
        .await?;
    assert_eq!(t.version, at + 22);
    ctx.cleanup().await
}
