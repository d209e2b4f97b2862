//! A transaction whose `BEGIN` outlives the statement deadline must not leave its pooled
//! connection inside a transaction. Against the real MariaDB, through a proxy that delays
//! every answer of the server, so the deadline fires after the server has run `BEGIN` and
//! before its answer arrives. (Its own test binary: the statement deadline is process-wide.)

use sqlx::MySqlPool;
use std::time::Duration;
use stocksvr_store::deadline::{begin, set_statement_deadline, Deadline};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DELAY: Duration = Duration::from_millis(150);

/// Forwards 127.0.0.1:<port> to `upstream`, holding back each chunk the server sends by DELAY.
async fn delaying_proxy(upstream: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = server_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    // Not a wait: the delay this proxy exists to add.
                    tokio::time::sleep(DELAY).await;
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A one-connection pool to the test database through the proxy.
async fn pool_through_proxy(url: &str) -> MySqlPool {
    // mysql://user:password@host:port/db
    let (scheme_auth, rest) = url.rsplit_once('@').expect("credentials in the url");
    let (host_port, db) = rest.split_once('/').expect("database in the url");
    let port = delaying_proxy(host_port.to_string()).await;
    let via = format!("{scheme_auth}@127.0.0.1:{port}/{db}");
    // No ping before each checkout: through the proxy it would take the whole deadline, and
    // the cut would land before BEGIN is even sent.
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(20))
        .connect(&via)
        .await
        .expect("pool")
}

async fn in_transaction(pool: &MySqlPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT CAST(@@in_transaction AS SIGNED)")
        .fetch_one(pool)
        .await
        .expect("@@in_transaction");
    n
}

/// Waits until the one connection is back in the pool: sqlx pings a released connection
/// (one slow round trip through the proxy) before others may take it, and a checkout waiting
/// for that would spend the deadline before BEGIN is even sent.
async fn idle(pool: &MySqlPool) {
    let ready = stocksvr_test_support::eventually(Duration::from_secs(5), || async {
        pool.num_idle() == 1
    })
    .await;
    assert!(ready, "the connection never came back to the pool");
}

#[tokio::test]
async fn a_begin_past_its_deadline_leaves_no_transaction_behind() {
    let db = stocksvr_test_support::TestDb::empty().await;
    let pool = pool_through_proxy(&db.url).await;
    // Connected (the handshake is slow through the proxy), idle, not in a transaction.
    assert_eq!(in_transaction(&pool).await, 0);

    // What sqlx's own begin does when its future is dropped at the deadline: the server ran
    // BEGIN, sqlx never counted it, and the one connection goes back to the pool inside it.
    // This is the hole `deadline::begin` closes; if a sqlx upgrade closes it too, this half
    // of the test says so and can go.
    idle(&pool).await;
    set_statement_deadline(Duration::from_millis(40));
    let cut = pool.begin().deadline().await;
    assert!(
        cut.is_err(),
        "BEGIN answered within 40 ms through a 150 ms proxy"
    );
    set_statement_deadline(Duration::from_secs(5));
    assert_eq!(
        in_transaction(&pool).await,
        1,
        "sqlx's begin cut by a deadline left no transaction (the hole is gone upstream)"
    );
    // Clean the connection for the second half: the stray transaction ends here.
    sqlx::query("ROLLBACK")
        .execute(&pool)
        .await
        .expect("rollback");
    assert_eq!(in_transaction(&pool).await, 0);

    // The same cut through deadline::begin: the caller gets the timeout, the BEGIN finishes
    // in its own task, and the transaction it got is rolled back before the connection is
    // handed out again.
    idle(&pool).await;
    set_statement_deadline(Duration::from_millis(40));
    match begin(&pool).await {
        Err(sqlx::Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
        other => panic!("want a timeout, got {:?}", other.map(|_| "a transaction")),
    }
    set_statement_deadline(Duration::from_secs(5));
    assert_eq!(
        in_transaction(&pool).await,
        0,
        "deadline::begin cut by its deadline left the connection inside a transaction"
    );

    // And within its deadline it is an ordinary transaction.
    let mut tx = begin(&pool).await.expect("begin");
    let (n,): (i64,) = sqlx::query_as("SELECT CAST(@@in_transaction AS SIGNED)")
        .fetch_one(&mut *tx)
        .await
        .expect("read");
    assert_eq!(n, 1);
    tx.rollback().await.expect("rollback");
    assert_eq!(in_transaction(&pool).await, 0);
}
