//! The database errors the projector meets, against the stack's MariaDB, as the one
//! classifier (`stocksvr_pipeline::failure`) classes them: a schema the build does not
//! expect or a missing privilege stops the projector (fatal: nothing is dead-lettered and
//! the offsets stay put until someone migrates or grants); a lost lock conflict or a
//! read-only server is waited out; data the server refuses is the record's own.

use stocksvr_pipeline::consumer::Failure;
use stocksvr_pipeline::failure::{is_access_denied, is_lock_conflict, sqlx_class, Class};
use stocksvr_test_support::TestDb;

/// The server's own error `number`, raised by `SIGNAL` for the errors a test cannot cause
/// by itself (a privilege the stack's user has, a deadlock on demand).
async fn signalled(pool: &sqlx::MySqlPool, number: u16, sqlstate: &str) -> sqlx::Error {
    let signal = format!(
        "SIGNAL SQLSTATE '{sqlstate}' SET MYSQL_ERRNO = {number}, MESSAGE_TEXT = 'raised by the test'"
    );
    sqlx::raw_sql(&signal)
        .execute(pool)
        .await
        .expect_err("SIGNAL raises its error")
}

#[tokio::test]
async fn schema_and_privilege_errors_are_fatal_lock_conflicts_wait_and_refused_data_is_invalid() {
    let db = TestDb::empty().await;
    let pool = &db.pool;

    let missing_table = sqlx::query("SELECT 1 FROM no_such_table")
        .execute(pool)
        .await
        .expect_err("no such table");
    assert_eq!(sqlx_class(&missing_table), Class::Fatal, "{missing_table}");
    sqlx::query("CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(3) NOT NULL)")
        .execute(pool)
        .await
        .expect("create");
    let missing_column = sqlx::query("SELECT no_such_column FROM t")
        .execute(pool)
        .await
        .expect_err("no such column");
    assert_eq!(
        sqlx_class(&missing_column),
        Class::Fatal,
        "{missing_column}"
    );

    // 1142 on a table, 1143 on a column, 1044 on a database, 1227 a global privilege.
    for (number, sqlstate) in [
        (1142, "42000"),
        (1143, "42000"),
        (1044, "42000"),
        (1227, "42000"),
    ] {
        let denied = signalled(pool, number, sqlstate).await;
        assert!(is_access_denied(&denied), "{number}: {denied}");
        assert_eq!(sqlx_class(&denied), Class::Fatal, "{number}: {denied}");
        assert!(
            matches!(Failure::from_sqlx(&denied), Failure::Fatal(_)),
            "{number}"
        );
    }

    // A deadlock victim, a lock wait timeout, a read-only server during a failover.
    for (number, sqlstate) in [(1213, "40001"), (1205, "HY000"), (1290, "HY000")] {
        let waited = signalled(pool, number, sqlstate).await;
        assert_eq!(is_lock_conflict(&waited), number != 1290, "{number}");
        assert!(!is_access_denied(&waited), "{number}");
        assert!(Failure::from_sqlx(&waited).is_unavailable(), "{number}");
    }

    let too_long = sqlx::query("INSERT INTO t (id, name) VALUES (?, ?)")
        .bind(1)
        .bind("too long")
        .execute(pool)
        .await
        .expect_err("strict mode refuses the value");
    assert_eq!(sqlx_class(&too_long), Class::Invalid, "{too_long}");
    assert!(!is_lock_conflict(&too_long));
}
