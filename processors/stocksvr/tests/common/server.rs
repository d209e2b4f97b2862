//! `stocksvr all` as a child process on a free port, with its log in a file.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub base: String,
    log: PathBuf,
}

impl Server {
    /// Starts `stocksvr all` on a free port with its stderr in a file.
    pub fn start(extra_env: &[(&str, &str)]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = std::env::temp_dir().join(format!("{}.log", super::unique("stocksvr-all")));
        let mut cmd = super::stocksvr();
        cmd.arg("all")
            .env("STOCKSVR__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("stocksvr all starts");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls until `cond` holds on the log, failing with the log after `timeout`.
    pub fn wait_for_log(&self, what: &str, timeout: Duration, cond: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if cond(&self.log()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("{what} not seen within {timeout:?}; log:\n{}", self.log());
    }

    /// Polls `/readyz` until it answers `status`.
    pub async fn wait_for_readyz(&self, status: u16, timeout: Duration) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            if let Ok(resp) = reqwest::get(format!("{}/readyz", self.base)).await {
                let code = resp.status().as_u16();
                let body: serde_json::Value = resp.json().await.expect("readyz JSON");
                if code == status {
                    return body;
                }
                last = Some((code, body));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "/readyz never answered {status}: last {last:?}; log:\n{}",
            self.log()
        );
    }

    /// SIGKILL: no drain, no commit, no leave-group; the broker notices only after the
    /// session timeout.
    pub fn kill9(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }

    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        let deadline = Instant::now() + Duration::from_secs(25);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, self.log());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "stocksvr did not stop within 25 s of SIGTERM; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}
