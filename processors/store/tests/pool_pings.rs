//! `mysql.ping_before_use`: the pings one use of the pool costs, counted by MariaDB on the
//! pooled connection itself (a COM_PING counts in the session's `Com_admin_commands`).

use sqlx::MySqlPool;
use std::time::Duration;

async fn pings(pool: &MySqlPool) -> u64 {
    stocksvr_test_support::session_status(pool, "Com_admin_commands").await
}

#[tokio::test]
async fn a_use_of_the_pool_pings_once_on_return_and_once_more_before_use_when_asked() {
    let db = stocksvr_test_support::TestDb::empty().await;
    for (ping_before_use, expected) in [(false, 1), (true, 2)] {
        // One connection: both reads run on the same session, and between them it went back
        // to the pool (sqlx pings it there) and came out again.
        let pool =
            stocksvr_store::mysql_pool_with(&db.url, 1, Duration::from_secs(10), ping_before_use)
                .expect("pool");
        let first = pings(&pool).await;
        let second = pings(&pool).await;
        assert_eq!(
            second - first,
            expected,
            "pings between two uses with ping_before_use = {ping_before_use}"
        );
        pool.close().await;
    }
}
