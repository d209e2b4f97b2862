//! A `stocksvr` role as a child process on a free port, with its log in a file; killed when
//! the test ends, pass or fail.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use stocksvr_test_support::{eventually_ok, eventually_some_blocking, ChildGuard};

pub struct Server {
    child: ChildGuard,
    pub base: String,
    pub port: u16,
    log: PathBuf,
}

impl Server {
    /// `stocksvr all` on a free port with `extra_env`; prefer [`super::TestEnv::server`],
    /// which puts it in the test's own database and topics.
    pub fn start(extra_env: &[(&str, &str)]) -> Self {
        let env: Vec<(String, String)> = extra_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_with(&env, "all")
    }

    /// `stocksvr <role>` on a free port with `env`.
    pub fn start_with(env: &[(String, String)], role: &str) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = std::env::temp_dir().join(format!("{}.log", super::unique("stocksvr")));
        let mut cmd = super::stocksvr();
        cmd.arg(role)
            .env("STOCKSVR__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            // No load balancer in front: a SIGTERM stops accepting at once (the drain test
            // sets a grace of its own).
            .env("STOCKSVR__HTTP__DRAIN_GRACE_MS", "0")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = ChildGuard::spawn(&mut cmd, &format!("stocksvr {role}"));
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            port,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls until `cond` holds on the log, failing with the log after `timeout`.
    pub fn wait_for_log(&self, what: &str, timeout: Duration, cond: impl Fn(&str) -> bool) {
        let seen = eventually_some_blocking(timeout, || cond(&self.log()).then_some(()));
        assert!(
            seen.is_some(),
            "{what} not seen within {timeout:?}; log:\n{}",
            self.log()
        );
    }

    /// Polls `/readyz` until it answers `status`.
    pub async fn wait_for_readyz(&self, status: u16, timeout: Duration) -> serde_json::Value {
        let url = format!("{}/readyz", self.base);
        let answered = eventually_ok(timeout, || async {
            let resp = reqwest::get(&url).await.map_err(|e| e.to_string())?;
            let code = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.expect("readyz JSON");
            if code == status {
                Ok(body)
            } else {
                Err(format!("{code} {body}"))
            }
        })
        .await;
        answered.unwrap_or_else(|last| {
            panic!(
                "/readyz never answered {status}: last {last}; log:\n{}",
                self.log()
            )
        })
    }

    /// Sends a signal ("-STOP", "-CONT", ...) to the process.
    pub fn signal(&self, signal: &str) {
        self.child.signal(signal);
    }

    /// SIGKILL: no drain, no commit, no leave-group; the broker notices only after the
    /// session timeout.
    pub fn kill9(mut self) -> String {
        self.child.kill9();
        self.log()
    }

    /// Waits up to `within` for the process to exit by itself (after a signal sent with
    /// [`Server::signal`]); panics with the log past it.
    pub fn wait_exit(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let exited = stocksvr_test_support::eventually_some_blocking(within, || {
            self.child.child().try_wait().expect("wait")
        });
        match exited {
            Some(status) => (status, self.log()),
            None => panic!(
                "stocksvr did not exit within {within:?}; log:\n{}",
                self.log()
            ),
        }
    }

    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.terminate(Duration::from_secs(25));
        (status, self.log())
    }
}

impl Drop for Server {
    /// A passing test's server log goes with it (a CI run started about a hundred servers and
    /// left each one's log in the temp directory); a failing test's stays for a look.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
