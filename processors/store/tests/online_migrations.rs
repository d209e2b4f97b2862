//! Every migration from now on must be safe to apply to a running deployment (docs/
//! operations.md, "Upgrading"): an ALTER TABLE names the algorithm it may use, so that MariaDB
//! refuses the statement instead of silently copying a big table under a lock, and nothing
//! rewrites rows in bulk. The migrations before [`FIRST_CHECKED`] were written before this
//! rule; they are applied already and a changed file would fail sqlx's checksum, so they stay
//! as they are.

use stocksvr_store::MIGRATOR;

/// The first migration this rule applies to.
const FIRST_CHECKED: i64 = 20261207000015;

/// Why `statement` (one SQL statement, comments removed) is not online-safe, if it is not.
fn refusal(statement: &str) -> Option<String> {
    let upper = statement.to_ascii_uppercase();
    let words: Vec<&str> = upper.split_whitespace().collect();
    match words.as_slice() {
        ["ALTER", "TABLE", ..] => {
            let algorithm = ["ALGORITHM=INSTANT", "ALGORITHM=NOCOPY", "ALGORITHM=INPLACE"]
                .into_iter()
                .find(|a| upper.replace(' ', "").contains(a));
            match algorithm {
                None => {
                    Some("an ALTER TABLE names no ALGORITHM (INSTANT, NOCOPY or INPLACE)".into())
                }
                Some("ALGORITHM=INPLACE") if !upper.replace(' ', "").contains("LOCK=NONE") => {
                    Some("an INPLACE ALTER TABLE must say LOCK=NONE".into())
                }
                Some(_) => None,
            }
        }
        ["CREATE", "TABLE", ..] | ["SET", ..] => None,
        ["CREATE", "INDEX", ..] | ["CREATE", "UNIQUE", "INDEX", ..] => {
            Some("CREATE INDEX cannot name an algorithm: use ALTER TABLE ... ADD KEY".into())
        }
        [verb @ ("UPDATE" | "DELETE" | "INSERT" | "REPLACE"), ..] => Some(format!(
            "{verb} in a migration rewrites rows under the migration's lock: backfill from the \
             service instead (expand, deploy, contract)"
        )),
        [verb @ ("DROP" | "RENAME" | "TRUNCATE"), "TABLE", ..] => Some(format!(
            "{verb} TABLE removes what the previous release may still use: contract in a later \
             release"
        )),
        _ => Some("a statement this check does not know: extend the check first".into()),
    }
}

/// The statements of `sql`: `--` comments removed, split at semicolons outside quotes.
fn statements(sql: &str) -> Vec<String> {
    let text: String = sql
        .lines()
        .map(|l| match l.find("--") {
            Some(at) if l[..at].matches('\'').count() % 2 == 0 => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                current.push(c);
            }
            ';' if !quoted => out.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    out.push(current);
    out.into_iter()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect()
}

#[test]
fn every_new_migration_is_online_safe() {
    let mut checked = 0;
    let mut refused = Vec::new();
    for m in MIGRATOR.iter().filter(|m| m.version >= FIRST_CHECKED) {
        checked += 1;
        for statement in statements(&m.sql) {
            if let Some(why) = refusal(&statement) {
                refused.push(format!(
                    "{} {}: {why}\n  {statement}",
                    m.version, m.description
                ));
            }
        }
    }
    assert!(
        checked > 0,
        "no migration from {FIRST_CHECKED} on: is the cut-off right?"
    );
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

#[test]
fn the_check_refuses_what_would_copy_lock_or_rewrite() {
    let refused = |sql: &str| statements(sql).iter().any(|s| refusal(s).is_some());
    for unsafe_sql in [
        "ALTER TABLE t ADD COLUMN c INT",
        "ALTER TABLE t MODIFY c BIGINT, ALGORITHM=INPLACE",
        "ALTER TABLE t ADD KEY k (c), ALGORITHM = INPLACE, LOCK = SHARED",
        "CREATE INDEX k ON t (c)",
        "UPDATE t SET c = 1",
        "DELETE FROM t WHERE c = 1",
        "DROP TABLE t",
        "RENAME TABLE t TO u",
        "OPTIMIZE TABLE t",
        // The second statement is unsafe; a semicolon in a string does not split.
        "ALTER TABLE t COMMENT 'a;b', ALGORITHM=INSTANT; ALTER TABLE t DROP COLUMN c",
    ] {
        assert!(refused(unsafe_sql), "{unsafe_sql}");
    }
    for safe_sql in [
        "-- a comment; with a semicolon\nALTER TABLE t ADD COLUMN c INT, ALGORITHM=INSTANT;",
        "ALTER TABLE t ADD KEY k (c), ALGORITHM=INPLACE, LOCK=NONE",
        "ALTER TABLE t DROP INDEX k, ALGORITHM = NOCOPY",
        "CREATE TABLE IF NOT EXISTS t (c INT)",
        "ALTER TABLE t ADD COLUMN c VARCHAR(8) COMMENT 'x; -- y', ALGORITHM=INSTANT",
    ] {
        assert!(!refused(safe_sql), "{safe_sql}");
    }
}

/// Rows per history table before a migration is applied: `STOCKSVR_MIGRATION_ROWS` (default
/// 100,000, a CI-sized "day"; a real day at 5,000 Trys/s is about 400 million rows, so run it
/// with as many as the disk takes before a release).
fn rows_per_table() -> u64 {
    std::env::var("STOCKSVR_MIGRATION_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// The longest stall a Try may see while a migration applies.
const STALL_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// Fills the reservation, ledger and outbox tables (the ones every migration so far touches
/// and the Try writes) with `n` rows each, with only the columns of the first migration (the
/// later ones all have defaults).
async fn fill(pool: &sqlx::MySqlPool, n: u64) {
    for sql in [
        "INSERT INTO inventory_reservation (id, order_id, order_item_id, merchant_id, dish_id, \
         stock_bucket_id, stock_date, quantity, order_type, expire_at, status, \
         current_operation_id, next_retry_at, expected_redis_version, created_at, updated_at) \
         SELECT seq, seq, seq, 1, seq % 1000, CONCAT('b_', seq % 1000), '2026-12-07', 1, 1, \
         NOW(3), 40, CONCAT('op_confirm_', seq), NOW(3), seq, NOW(3), NOW(3) FROM seq_1_to_{n}",
        "INSERT INTO inventory_ledger (ledger_id, operation_id, reservation_id, stock_bucket_id, \
         merchant_id, dish_id, action, quantity, available_delta, reserved_delta, redis_version, \
         created_at) SELECT CONCAT('l_', seq), CONCAT('op_try_', seq), seq, \
         CONCAT('b_', seq % 1000), 1, seq % 1000, 2, 1, -1, 1, seq, NOW(3) FROM seq_1_to_{n}",
        "INSERT INTO inventory_outbox (event_id, aggregate_id, event_type, topic, partition_key, \
         payload, status, next_retry_at, created_at) SELECT CONCAT('op_try_', seq, ':E'), seq, \
         'InventoryRedisReserved', 'inventory.stock-change.v1', CONCAT('b_', seq % 1000), \
         JSON_OBJECT('reservation_id', seq, 'note', REPEAT('x', 400)), 30, NOW(3), NOW(3) \
         FROM seq_1_to_{n}",
    ] {
        sqlx::raw_sql(&sql.replace("{n}", &n.to_string()))
            .execute(pool)
            .await
            .expect("fill");
    }
}

/// What a Try writes, in one transaction: its PREPARING row, the CAS to RESERVED and its
/// outbox row. Returns how long it took.
async fn one_try(pool: &sqlx::MySqlPool, id: u64) -> Result<std::time::Duration, sqlx::Error> {
    let started = std::time::Instant::now();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO inventory_reservation (id, order_id, order_item_id, merchant_id, dish_id, \
         stock_bucket_id, stock_date, quantity, order_type, expire_at, status, \
         current_operation_id, next_retry_at, created_at, updated_at) \
         VALUES (?, ?, ?, 1, 7, 'b_7', '2026-12-07', 1, 1, NOW(3), 10, ?, NOW(3), NOW(3), NOW(3))",
    )
    .bind(id)
    .bind(id)
    .bind(id)
    .bind(format!("op_try_{id}"))
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE inventory_reservation SET status = 20, expected_redis_version = ?, \
         version = version + 1 WHERE id = ? AND status = 10",
    )
    .bind(id)
    .bind(id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO inventory_outbox (event_id, aggregate_id, event_type, topic, partition_key, \
         payload, status, next_retry_at, created_at) \
         VALUES (?, ?, 'InventoryRedisReserved', 'inventory.stock-change.v1', 'b_7', '{}', 10, \
         NOW(3), NOW(3))",
    )
    .bind(format!("op_try_{id}:E"))
    .bind(id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(started.elapsed())
}

/// Each migration from [`FIRST_CHECKED`] on (with `STOCKSVR_MIGRATION_ALL=1`: every one
/// after the first, which only creates tables; about 2 minutes), applied to tables holding
/// [`rows_per_table`] rows while four writers run Trys' statements without pause: no Try
/// waits longer than [`STALL_BOUND`], and Trys kept committing while it ran (a migration that
/// locked the tables for its whole run would show as one long stall).
#[tokio::test]
async fn every_new_migration_applies_under_trys_without_a_long_stall() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let n = rows_per_table();
    let mut measured = Vec::new();
    let first = MIGRATOR
        .iter()
        .map(|m| m.version)
        .min()
        .expect("migrations");
    let from = if std::env::var("STOCKSVR_MIGRATION_ALL").is_ok_and(|v| v == "1") {
        first + 1
    } else {
        FIRST_CHECKED
    };
    for target in MIGRATOR.iter().filter(|m| m.version >= from) {
        let db = stocksvr_test_support::TestDb::empty().await;
        for m in MIGRATOR.iter().filter(|m| m.version < target.version) {
            sqlx::raw_sql(&m.sql)
                .execute(&db.pool)
                .await
                .expect("earlier migration");
        }
        fill(&db.pool, n).await;
        let stop = Arc::new(AtomicBool::new(false));
        let next_id = Arc::new(AtomicU64::new(10_000_000_000));
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let (pool, stop, next_id) = (db.pool.clone(), stop.clone(), next_id.clone());
                tokio::spawn(async move {
                    let mut longest = std::time::Duration::ZERO;
                    let mut done = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        longest = longest.max(one_try(&pool, id).await.expect("a Try's writes"));
                        done += 1;
                    }
                    (longest, done)
                })
            })
            .collect();
        // The writers are running before the migration starts.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let before = next_id.load(Ordering::Relaxed);
        let started = std::time::Instant::now();
        sqlx::raw_sql(&target.sql)
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("migration {} {}: {e}", target.version, target.description));
        let took = started.elapsed();
        let during = next_id.load(Ordering::Relaxed) - before;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let mut longest = std::time::Duration::ZERO;
        for w in writers {
            let (l, done) = w.await.expect("writer");
            assert!(done > 0, "a writer never committed");
            longest = longest.max(l);
        }
        println!(
            "migration {} {}: {n} rows a table, applied in {took:.2?}; {during} Trys meanwhile, \
             the longest {longest:.2?}",
            target.version, target.description
        );
        measured.push((target.version, took, during, longest));
    }
    assert!(!measured.is_empty(), "no migration from {from} on");
    for (version, took, during, longest) in measured {
        assert!(
            longest <= STALL_BOUND,
            "migration {version}: a Try waited {longest:?} (bound {STALL_BOUND:?})"
        );
        // A migration of more than a moment that no Try got through was a lock, whatever
        // the single longest wait says.
        assert!(
            took < std::time::Duration::from_millis(200) || during > 0,
            "migration {version} ran {took:?} and no Try committed meanwhile"
        );
    }
}
