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
