//! A raw HTTP client for the middleware tests: a plain socket on a blocking thread, so the
//! client itself records no metrics into the test's local recorder.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// One HTTP/1.1 GET with `Connection: close`; returns the whole reply (status line,
/// headers and body).
pub async fn get(addr: SocketAddr, path: &str) -> String {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        let mut reply = String::new();
        s.read_to_string(&mut reply).expect("reply");
        reply
    })
    .await
    .expect("client thread")
}

/// Polls `check` every 5 ms until it holds; fails the test with `what` after 10 s.
pub async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
