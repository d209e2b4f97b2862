//! The inventory Lua scripts against a real Redis 7 (`scripts/stack up redis`, port 6380, or
//! `STOCKSVR__REDIS__URL`). Every test works in its own buckets: the merchant id is random per
//! test, so tests run in parallel in db 0 next to anything else, and each test deletes its keys.

use anyhow::{ensure, Context, Result};
use redis::aio::ConnectionManager;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stocksvr_store::lua::{
    BucketKeys, BucketState, ExecError, LuaExecutor, OpResult, Outcome, StockAfter, DEFAULT_OP_TTL,
};

const DATE: &str = "2026-07-26";

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
    conn: ConnectionManager,
    merchant: u64,
}

impl Ctx {
    async fn new() -> Result<Self> {
        let conn = stocksvr_store::connect_redis(&redis_url(), Duration::from_secs(10))
            .await
            .context("redis at 127.0.0.1:6380 (scripts/stack up redis)")?;
        Ok(Self {
            exec: LuaExecutor::new(conn.clone(), DEFAULT_OP_TTL),
            conn,
            merchant: fresh_merchant(),
        })
    }

    fn bucket(&self, dish: u64) -> BucketKeys {
        BucketKeys::new(self.merchant, dish, DATE).expect("valid date")
    }

    /// A bucket of `total`, OPEN, version 1.
    async fn open_bucket(&self, dish: u64, total: i64) -> Result<BucketKeys> {
        let keys = self.bucket(dish);
        let r = self.exec.init_bucket(&keys, "init", total, 1).await?;
        ensure!(
            r.outcome == Outcome::Succeeded && r.after.version == 1,
            "{r:?}"
        );
        Ok(keys)
    }

    async fn numbers(&self, keys: &BucketKeys) -> Result<StockAfter> {
        let s = self
            .exec
            .read_bucket(keys)
            .await?
            .context("bucket exists")?;
        Ok(StockAfter {
            version: s.version,
            total: s.total,
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
        })
    }

    async fn exists(&self, key: &str) -> Result<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await?;
        Ok(n == 1)
    }

    /// Deletes every key of this test's merchant.
    async fn cleanup(&self) -> Result<()> {
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

fn assert_conserved(n: &StockAfter) {
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
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let qty = (i % 3 + 1) as u32;
            let r = exec
                .try_reserve(&keys, 1_000 + i, &format!("try-{i}"), qty)
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
        assert_conserved(&r.after);
        match r.outcome {
            Outcome::Succeeded => {
                granted += i64::from(qty);
                succeeded += 1;
            }
            Outcome::Insufficient => insufficient += 1,
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
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            exec.try_reserve(&keys, 77, "try-77", 3).await
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
    assert_eq!(first.outcome, Outcome::Succeeded);
    assert_eq!(first.phase.as_deref(), Some("RESERVED"));
    for r in &results {
        assert_eq!(
            OpResult {
                replayed: false,
                ..r.clone()
            },
            first
        );
    }
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.available, n.reserved, n.version), (7, 3, 2));
    ctx.cleanup().await
}

#[tokio::test]
async fn cancel_before_try_is_an_empty_rollback_and_fences_the_late_try() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 10).await?;
    let before = ctx.numbers(&keys).await?;

    let c = ctx.exec.cancel(&keys, 5, "cancel-5", 2).await?;
    assert_eq!(c.outcome, Outcome::Succeeded);
    assert!(c.empty_rollback && !c.replayed);
    assert_eq!(c.phase.as_deref(), Some("CANCELED"));
    assert_eq!(
        ctx.numbers(&keys).await?,
        before,
        "an empty rollback adds no stock"
    );
    let fence = ctx.exec.read_fence(&keys, 5).await?.context("fence")?;
    assert_eq!(fence.phase, "CANCELED");
    assert_eq!(fence.quantity, 2);
    assert_eq!(fence.cancel_op.as_deref(), Some("cancel-5"));
    assert_eq!(fence.try_op, None);

    // The Try that was in flight arrives now (hanging): fenced, nothing moves.
    let t = ctx.exec.try_reserve(&keys, 5, "try-5", 2).await?;
    assert_eq!(t.outcome, Outcome::Fenced);
    assert_eq!(ctx.numbers(&keys).await?, before);
    assert_eq!(
        ctx.exec.read_fence(&keys, 5).await?.context("fence")?,
        fence
    );

    // A retry of the same Try, and a second Cancel with another id: first results / no change.
    let t2 = ctx.exec.try_reserve(&keys, 5, "try-5", 2).await?;
    assert_eq!((t2.outcome, t2.replayed), (Outcome::Fenced, true));
    let c2 = ctx.exec.cancel(&keys, 5, "cancel-5-again", 2).await?;
    assert_eq!(c2.outcome, Outcome::Succeeded);
    assert!(c2.empty_rollback && !c2.replayed);
    let c3 = ctx.exec.cancel(&keys, 5, "cancel-5", 2).await?;
    assert_eq!(
        c3,
        OpResult {
            replayed: true,
            ..c
        }
    );
    assert_eq!(ctx.numbers(&keys).await?, before);

    // Cancel with no bucket at all still fences: a Try waiting for a lazy init must not
    // freeze stock after it.
    let missing = ctx.bucket(2);
    let c = ctx.exec.cancel(&missing, 6, "cancel-6", 1).await?;
    assert!(c.succeeded() && c.empty_rollback);
    assert!(
        !ctx.exists(missing.stock()).await?,
        "cancel never creates the bucket"
    );
    ctx.exec.init_bucket(&missing, "init-2", 4, 1).await?;
    let t = ctx.exec.try_reserve(&missing, 6, "try-6", 1).await?;
    assert_eq!(t.outcome, Outcome::Fenced);
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
            .try_reserve(&keys, r, &format!("try-{r}"), qty)
            .await?;
        ensure!(t.succeeded(), "{t:?}");
        qty_of.push(qty);
    }

    let mut tasks = Vec::new();
    for r in 0..200u64 {
        let (e1, e2) = (ctx.exec.clone(), ctx.exec.clone());
        let (k1, k2) = (keys.clone(), keys.clone());
        let qty = qty_of[r as usize];
        // Alternate which call is issued first so both outcomes of the race get exercised.
        let (confirm, cancel) = if r % 2 == 0 {
            let confirm =
                tokio::spawn(async move { e1.confirm(&k1, r, &format!("confirm-{r}")).await });
            let cancel =
                tokio::spawn(async move { e2.cancel(&k2, r, &format!("cancel-{r}"), qty).await });
            (confirm, cancel)
        } else {
            let cancel =
                tokio::spawn(async move { e2.cancel(&k2, r, &format!("cancel-{r}"), qty).await });
            let confirm =
                tokio::spawn(async move { e1.confirm(&k1, r, &format!("confirm-{r}")).await });
            (confirm, cancel)
        };
        tasks.push((r, confirm, cancel));
    }
    let mut sold = 0i64;
    let mut returned = 0i64;
    for (r, confirm, cancel) in tasks {
        let (confirm, cancel) = (confirm.await??, cancel.await??);
        let qty = i64::from(qty_of[r as usize]);
        match (confirm.outcome, cancel.outcome) {
            (Outcome::Succeeded, Outcome::Conflict) => {
                assert_eq!(cancel.phase.as_deref(), Some("CONFIRMED"));
                sold += qty;
            }
            (Outcome::Conflict, Outcome::Succeeded) => {
                assert_eq!(confirm.phase.as_deref(), Some("CANCELED"));
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
    ctx.exec.try_reserve(&keys, 1, "try-1", 5).await?;
    ctx.exec.confirm(&keys, 1, "confirm-1").await?;
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.available, n.reserved, n.sold), (15, 0, 5));

    let r1 = ctx.exec.refund(&keys, 1, "refund-1a", 2).await?;
    assert_eq!(r1.outcome, Outcome::Succeeded);
    assert_eq!(
        r1.phase.as_deref(),
        Some("CONFIRMED"),
        "a partial refund keeps the phase"
    );
    assert_eq!((r1.after.available, r1.after.sold), (17, 3));

    // The same refund op again: the first result, nothing moves.
    let again = ctx.exec.refund(&keys, 1, "refund-1a", 2).await?;
    assert_eq!(
        again,
        OpResult {
            replayed: true,
            ..r1.clone()
        }
    );
    assert_eq!(ctx.numbers(&keys).await?.sold, 3);

    // More than what is left: rejected, no change; and recorded as such.
    let over = ctx.exec.refund(&keys, 1, "refund-1b", 4).await?;
    assert_eq!(over.outcome, Outcome::OverRefund);
    assert_eq!(ctx.numbers(&keys).await?.sold, 3);
    let over_again = ctx.exec.refund(&keys, 1, "refund-1b", 4).await?;
    assert_eq!(
        (over_again.outcome, over_again.replayed),
        (Outcome::OverRefund, true)
    );

    let r2 = ctx.exec.refund(&keys, 1, "refund-1c", 1).await?;
    assert_eq!(r2.phase.as_deref(), Some("CONFIRMED"));
    let r3 = ctx.exec.refund(&keys, 1, "refund-1d", 2).await?;
    assert_eq!(r3.phase.as_deref(), Some("REFUNDED"));
    assert_eq!((r3.after.available, r3.after.sold), (20, 0));
    let fence = ctx.exec.read_fence(&keys, 1).await?.context("fence")?;
    assert_eq!((fence.phase.as_str(), fence.refunded), ("REFUNDED", 5));
    let nothing_left = ctx.exec.refund(&keys, 1, "refund-1e", 1).await?;
    assert_eq!(nothing_left.outcome, Outcome::Conflict);
    // A late Try of a refunded reservation is fenced too.
    let late = ctx.exec.try_reserve(&keys, 1, "try-1-late", 5).await?;
    assert_eq!(late.outcome, Outcome::Fenced);

    // From RESERVED (a scheduled order refunded before its confirm time): reserved -> available.
    ctx.exec.try_reserve(&keys, 2, "try-2", 4).await?;
    let r = ctx.exec.refund(&keys, 2, "refund-2a", 1).await?;
    assert_eq!(r.phase.as_deref(), Some("RESERVED"));
    assert_eq!((r.after.available, r.after.reserved), (17, 3));
    // Confirming the rest sells only what was not refunded.
    let c = ctx.exec.confirm(&keys, 2, "confirm-2").await?;
    assert_eq!(
        (c.after.available, c.after.reserved, c.after.sold),
        (17, 0, 3)
    );
    let r = ctx.exec.refund(&keys, 2, "refund-2b", 3).await?;
    assert_eq!(r.phase.as_deref(), Some("REFUNDED"));
    assert_eq!((r.after.available, r.after.sold), (20, 0));

    // Whole refund straight from RESERVED.
    ctx.exec.try_reserve(&keys, 3, "try-3", 2).await?;
    let r = ctx.exec.refund(&keys, 3, "refund-3", 2).await?;
    assert_eq!(r.phase.as_deref(), Some("REFUNDED"));
    assert_eq!(r.after.reserved, 0);

    // Refund of a reservation that never reserved, or was cancelled: conflict, no change.
    let none = ctx.exec.refund(&keys, 4, "refund-4", 1).await?;
    assert_eq!(none.outcome, Outcome::Conflict);
    ctx.exec.try_reserve(&keys, 5, "try-5", 1).await?;
    ctx.exec.cancel(&keys, 5, "cancel-5", 1).await?;
    let canceled = ctx.exec.refund(&keys, 5, "refund-5", 1).await?;
    assert_eq!(canceled.outcome, Outcome::Conflict);
    let cancel_after_confirm = ctx.exec.cancel(&keys, 2, "cancel-2", 4).await?;
    assert_eq!(cancel_after_confirm.outcome, Outcome::Conflict);

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
    assert_eq!(first.outcome, Outcome::Succeeded);
    assert_eq!(
        first.after,
        StockAfter {
            version: 1,
            total: 10,
            available: 10,
            reserved: 0,
            sold: 0
        }
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
            ..first.clone()
        }
    );
    let same = ctx.exec.init_bucket(&keys, "init-b", 99, 3).await?;
    assert_eq!(
        (same.outcome, same.after),
        (Outcome::Succeeded, first.after)
    );
    let older = ctx.exec.init_bucket(&keys, "init-c", 99, 2).await?;
    assert_eq!(
        (older.outcome, older.after),
        (Outcome::Succeeded, first.after)
    );

    assert_eq!(first.phase.as_deref(), Some("INITIALIZED"));
    assert_eq!(same.phase.as_deref(), Some("UNCHANGED"));

    // An existing bucket is never rebuilt by an init, whatever its baseline: a newer total
    // reaches it through adjust, which books the difference, not the whole total again.
    let newer = ctx.exec.init_bucket(&keys, "init-d", 12, 4).await?;
    assert_eq!(
        (newer.outcome, newer.after, newer.phase.as_deref()),
        (Outcome::Succeeded, first.after, Some("UNCHANGED"))
    );
    ctx.exec.try_reserve(&keys, 1, "try-1", 2).await?;
    let traded = ctx.exec.init_bucket(&keys, "init-e", 50, 5).await?;
    assert_eq!(traded.outcome, Outcome::Succeeded);
    let n = ctx.numbers(&keys).await?;
    assert_eq!((n.total, n.available, n.reserved), (10, 8, 2));

    // Concurrent inits of a fresh bucket converge on one creation.
    let fresh = ctx.bucket(2);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let exec = ctx.exec.clone();
        let keys = fresh.clone();
        tasks.push(tokio::spawn(async move {
            exec.init_bucket(&keys, &format!("lazy-{i}"), 30, 1).await
        }));
    }
    for task in tasks {
        let r = task.await??;
        assert_eq!(r.outcome, Outcome::Succeeded);
        assert_eq!(r.after.version, 1);
    }
    ctx.cleanup().await
}

#[tokio::test]
async fn adjust_below_committed_gives_a_deficit_that_returns_pay_down() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 100).await?;
    // total 100: reserved 10, sold 20, available 70 (seed §12.3).
    ctx.exec.try_reserve(&keys, 1, "try-1", 20).await?;
    ctx.exec.confirm(&keys, 1, "confirm-1").await?;
    ctx.exec.try_reserve(&keys, 2, "try-2", 10).await?;
    let v = ctx.numbers(&keys).await?.version;

    let up = ctx.exec.adjust(&keys, "adj-1", 120, Some(v), 1).await?;
    assert_eq!(up.outcome, Outcome::Succeeded);
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
    assert_eq!(stale.outcome, Outcome::Conflict);
    assert_eq!(ctx.numbers(&keys).await?.total, 120);
    let replay = ctx.exec.adjust(&keys, "adj-1", 120, Some(v), 1).await?;
    assert_eq!(
        replay,
        OpResult {
            replayed: true,
            ..up.clone()
        }
    );

    // Below reserved + sold: available 0, deficit reported, nothing taken from accepted orders.
    let down = ctx.exec.adjust(&keys, "adj-3", 20, None, 2).await?;
    assert_eq!(down.outcome, Outcome::Succeeded);
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
    let t = ctx.exec.try_reserve(&keys, 3, "try-3", 1).await?;
    assert_eq!(t.outcome, Outcome::Insufficient);

    // Returned stock pays the deficit first: available + reserved + sold == total + deficit.
    let c = ctx.exec.cancel(&keys, 2, "cancel-2", 10).await?;
    assert_eq!(
        (c.after.available, c.after.reserved, c.after.sold, c.deficit),
        (0, 0, 20, 0)
    );
    let r = ctx.exec.refund(&keys, 1, "refund-1", 5).await?;
    assert_eq!((r.after.available, r.after.sold, r.deficit), (5, 15, 0));
    assert_conserved(&ctx.numbers(&keys).await?);

    // An adjust with an older baseline than the stored one is stale.
    let old = ctx.exec.adjust(&keys, "adj-4", 500, None, 1).await?;
    assert_eq!(old.outcome, Outcome::Conflict);
    ctx.cleanup().await
}

#[tokio::test]
async fn missing_and_closed_buckets() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.bucket(1);

    // Missing: nothing recorded, so the same op works after the (lazy) init.
    let t = ctx.exec.try_reserve(&keys, 1, "try-1", 1).await?;
    assert_eq!(t.outcome, Outcome::BucketMissing);
    assert!(!ctx.exists(&keys.op("try-1")).await?);
    assert!(
        !ctx.exists(keys.stock()).await?,
        "a script never creates a bucket by accident"
    );
    for r in [
        ctx.exec.adjust(&keys, "adj", 5, None, 1).await?,
        ctx.exec
            .set_state(&keys, "close", BucketState::Closed, None)
            .await?,
    ] {
        assert_eq!(r.outcome, Outcome::BucketMissing);
    }
    ctx.exec.init_bucket(&keys, "init", 5, 1).await?;
    let t = ctx.exec.try_reserve(&keys, 1, "try-1", 1).await?;
    assert_eq!((t.outcome, t.replayed), (Outcome::Succeeded, false));
    ctx.exec.try_reserve(&keys, 2, "try-2", 1).await?;

    // Closed: no new Trys (not recorded), but existing reservations confirm and cancel.
    let closed = ctx
        .exec
        .set_state(&keys, "close", BucketState::Closed, None)
        .await?;
    assert_eq!(closed.outcome, Outcome::Succeeded);
    let t = ctx.exec.try_reserve(&keys, 3, "try-3", 1).await?;
    assert_eq!(t.outcome, Outcome::BucketClosed);
    assert!(!ctx.exists(&keys.op("try-3")).await?);
    assert!(ctx.exec.confirm(&keys, 1, "confirm-1").await?.succeeded());

    // Archiving waits for the reservations; reopening is refused.
    let early = ctx
        .exec
        .set_state(&keys, "archive-early", BucketState::Archived, None)
        .await?;
    assert_eq!(early.outcome, Outcome::Conflict);
    let reopen = ctx
        .exec
        .set_state(&keys, "reopen", BucketState::Open, None)
        .await?;
    assert_eq!(reopen.outcome, Outcome::Conflict);
    assert!(ctx.exec.cancel(&keys, 2, "cancel-2", 1).await?.succeeded());
    let archived = ctx
        .exec
        .set_state(
            &keys,
            "archive",
            BucketState::Archived,
            Some(Duration::from_secs(3_600)),
        )
        .await?;
    assert_eq!(archived.outcome, Outcome::Succeeded);
    let stored = ctx.exec.read_bucket(&keys).await?.context("bucket")?;
    assert_eq!(stored.state, BucketState::Archived);
    let mut conn = ctx.conn.clone();
    let ttl: i64 = redis::cmd("TTL")
        .arg(keys.stock())
        .query_async(&mut conn)
        .await?;
    assert!((3_500..=3_600).contains(&ttl), "ttl {ttl}");
    let adj = ctx.exec.adjust(&keys, "adj-late", 9, None, 1).await?;
    assert_eq!(adj.outcome, Outcome::BucketClosed);
    // A refund of a sale still lands in its own day.
    let r = ctx.exec.refund(&keys, 1, "refund-1", 1).await?;
    assert_eq!((r.outcome, r.after.available), (Outcome::Succeeded, 5));
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
    ctx.exec.try_reserve(&keys, 1, "try-1", 1).await?;
    assert_eq!(
        pttl(keys.fence(1)).await?,
        -1,
        "a RESERVED fence must not expire"
    );
    let op_ttl = pttl(keys.op("try-1")).await?;
    let month = DEFAULT_OP_TTL.as_millis() as i64;
    assert!(op_ttl > month - 60_000 && op_ttl <= month, "{op_ttl}");
    ctx.exec.confirm(&keys, 1, "confirm-1").await?;
    assert!(pttl(keys.fence(1)).await? > month - 60_000);
    ctx.cleanup().await
}

#[tokio::test]
async fn replays_survive_an_expired_op_record_through_the_fence() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 5).await?;
    let t = ctx.exec.try_reserve(&keys, 1, "try-1", 2).await?;
    let mut conn = ctx.conn.clone();
    let _: i64 = redis::cmd("DEL")
        .arg(keys.op("try-1"))
        .query_async(&mut conn)
        .await?;
    let again = ctx.exec.try_reserve(&keys, 1, "try-1", 2).await?;
    assert_eq!((again.outcome, again.replayed), (Outcome::Succeeded, true));
    assert_eq!(again.after, t.after, "nothing moved twice");
    ctx.cleanup().await
}

#[tokio::test]
async fn bad_calls_are_refused_without_effect() -> Result<()> {
    let ctx = Ctx::new().await?;
    let keys = ctx.open_bucket(1, 5).await?;
    ctx.exec.try_reserve(&keys, 1, "op-x", 1).await?;
    // One operation id for two reservations is a caller bug: refused, not answered for the other.
    let reused = ctx.exec.try_reserve(&keys, 2, "op-x", 1).await;
    assert!(
        matches!(reused, Err(ExecError::Rejected { .. })),
        "{reused:?}"
    );
    let reused = ctx.exec.cancel(&keys, 1, "op-x", 1).await;
    assert!(
        matches!(reused, Err(ExecError::Rejected { .. })),
        "{reused:?}"
    );
    assert!(matches!(
        ctx.exec.try_reserve(&keys, 3, "op-y", 0).await,
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
    assert!(ctx
        .exec
        .try_reserve(&keys, 1, "try-1", 1)
        .await?
        .succeeded());
    let mut conn = ctx.conn.clone();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await?;
    let r = ctx.exec.try_reserve(&keys, 2, "try-2", 1).await?;
    assert!(r.succeeded() && !r.replayed);
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
    let keys = BucketKeys::new(1, 2, DATE)?;
    let err = exec
        .try_reserve(&keys, 1, "try-1", 1)
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
