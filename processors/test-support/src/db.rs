//! A database of the test's own on the stack's MariaDB, dropped when the test ends.

use crate::{block_on_cleanup, infra, unique};
use sqlx::MySqlPool;
use std::time::Duration;

pub struct TestDb {
    pub name: String,
    /// `mysql://…/<name>`: hand it to a child process as `STOCKSVR__MYSQL__URL`.
    pub url: String,
    pub pool: MySqlPool,
    server_url: String,
}

impl TestDb {
    /// An empty database (no tables).
    pub async fn empty() -> Self {
        let server_url = infra().mysql.url.expose().to_string();
        let admin = stocksvr_store::mysql_pool(&server_url, 1, Duration::from_secs(10))
            .expect("pool on the stack's MariaDB");
        let name = unique("stocksvr_test");
        sqlx::query(&format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
            .execute(&admin)
            .await
            .expect("create test database (the stack's user has CREATE)");
        admin.close().await;
        let (prefix, _) = server_url
            .rsplit_once('/')
            .expect("the mysql url names a database");
        let url = format!("{prefix}/{name}");
        let pool = stocksvr_store::mysql_pool(&url, 8, Duration::from_secs(10)).expect("pool");
        Self {
            name,
            url,
            pool,
            server_url,
        }
    }

    /// A database with every migration applied.
    pub async fn migrated() -> Self {
        let db = Self::empty().await;
        stocksvr_store::migrate(&db.pool).await.expect("migrate");
        db
    }

    /// The `STOCKSVR__MYSQL__URL` entry for a child process.
    pub fn env(&self) -> (&'static str, String) {
        ("STOCKSVR__MYSQL__URL", self.url.clone())
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // The pool is not closed here: its connections belong to the test's runtime, which
        // is blocked in this drop, so `close()` from the cleanup's runtime waited out its
        // 30 s for them. They close with the test's runtime.
        let (name, server_url) = (self.name.clone(), self.server_url.clone());
        block_on_cleanup(format!("database {name}"), async move {
            let admin = stocksvr_store::mysql_pool(&server_url, 1, Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            let mut conn = admin.acquire().await.map_err(|e| e.to_string())?;
            // A session of the test may still hold a transaction, and with it metadata locks
            // that hold the DROP back: sqlx sends the ROLLBACK of a dropped transaction from a
            // task of the test's runtime, which is blocked here, so it never goes out (a test
            // whose last statement was refused inside a transaction waited out the whole
            // lock_wait_timeout, and its database stayed behind). The test is over: end every
            // session still in its database, the test's pool and any child process's.
            let sessions: Vec<(i64,)> = sqlx::query_as(
                "SELECT id FROM information_schema.processlist \
                 WHERE db = ? AND id <> CONNECTION_ID()",
            )
            .bind(&name)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
            for (id,) in sessions {
                // Gone by itself meanwhile is as good.
                let _ = sqlx::query("KILL CONNECTION ?")
                    .bind(id)
                    .execute(&mut *conn)
                    .await;
            }
            // A child process killed mid-transaction may still hold a metadata lock for a
            // moment; do not wait the server's default (a year) for it.
            sqlx::query("SET SESSION lock_wait_timeout = 20")
                .execute(&mut *conn)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS `{name}`"))
                .execute(&mut *conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        });
    }
}

/// A test database stands in for its pool (`&db` where a `&MySqlPool` is wanted).
impl std::ops::Deref for TestDb {
    type Target = MySqlPool;
    fn deref(&self) -> &MySqlPool {
        &self.pool
    }
}

/// A counter of the session's status (`Com_update`, `Com_admin_commands`, …) as MariaDB
/// keeps it for the connection this read runs on: with a pool of one connection, the
/// statements the pool's other uses ran on that same session.
pub async fn session_status(pool: &MySqlPool, name: &str) -> u64 {
    let (value,): (String,) = sqlx::query_as(
        "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = ?",
    )
    .bind(name.to_uppercase())
    .fetch_one(pool)
    .await
    .expect("session status");
    value.parse().expect("a count")
}
