//! Child processes that never outlive their test.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// A child process killed (SIGKILL) when the guard drops, pass or fail: a panicking test
/// must not leave a processor running after the suite.
pub struct ChildGuard {
    child: Option<Child>,
    what: String,
}

impl ChildGuard {
    pub fn spawn(cmd: &mut Command, what: &str) -> Self {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
        Self {
            child: Some(child),
            what: what.to_string(),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// The child, while it is ours.
    pub fn child(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("the child was not handed back yet")
    }

    /// Sends `signal` (e.g. "-STOP", "-CONT", "-TERM", "-KILL") to the child.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {} failed", self.what);
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `within` for the exit; SIGKILL and a panic past it.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("-TERM");
        let exited =
            crate::eventually_some_blocking(within, || self.child().try_wait().expect("wait"));
        exited.unwrap_or_else(|| {
            self.kill9();
            panic!("{} did not stop within {within:?} of SIGTERM", self.what)
        })
    }

    /// Whether the child is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child().try_wait(), Ok(None))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `cmd` to completion but kills it after `limit`, so a hung client (a Python script,
/// say) fails its test instead of stalling the suite. Both pipes are drained while it runs:
/// a child that fills a pipe buffer would otherwise block for ever.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    let what = format!("{cmd:?}");
    let mut guard = ChildGuard::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()), &what);
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        guard
            .child()
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        guard
            .child()
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let exited = crate::eventually_some_blocking(limit, || guard.child().try_wait().expect("wait"));
    let Some(status) = exited else {
        guard.kill9();
        let err = stderr.join().unwrap_or_default();
        panic!(
            "{what} did not finish within {limit:?}; its stderr:\n{}",
            String::from_utf8_lossy(&err)
        );
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}
