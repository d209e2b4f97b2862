//! Servers of a test's own, started by `scripts/stack` on ports nobody else uses, for the
//! tests that stop (SIGSTOP) or kill a server: doing that to the shared stack would fail
//! every test running beside them, and for a secure stack (`up --secure`, see
//! [`crate::secure_stack`]). Stopped and deleted when the guard drops.

use crate::repo_root;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub struct PrivateStack {
    pub(crate) dir: PathBuf,
    base: u16,
    cache: PathBuf,
    services: Vec<String>,
    /// Every server with TLS and per-role credentials (`STACK_SECURE=1`).
    secure: bool,
    /// What `scripts/stack env` exports, read once.
    pub(crate) exports: std::sync::OnceLock<Vec<(String, String)>>,
}

impl PrivateStack {
    /// Starts `services` (e.g. `["mariadb"]`) of a private stack and waits until they are
    /// ready. Downloads come from the shared cache (`STACK_CACHE`, else `.stack/cache`).
    pub fn start(services: &[&str]) -> Self {
        Self::start_with(services, false)
    }

    /// As [`PrivateStack::start`], secure (`scripts/stack up --secure`): a CA of its own,
    /// Kafka on SASL_SSL with ACLs, the registry on HTTPS with users, MariaDB requiring TLS,
    /// Redis on TLS with an ACL user.
    pub fn start_secure(services: &[&str]) -> Self {
        Self::start_with(services, true)
    }

    fn start_with(services: &[&str], secure: bool) -> Self {
        let root = repo_root();
        let cache = std::env::var("STACK_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join(".stack/cache"));
        let base = free_base();
        let dir = std::env::temp_dir().join(crate::unique("stocksvr-private-stack"));
        let stack = Self {
            dir,
            base,
            cache,
            services: services.iter().map(|s| s.to_string()).collect(),
            secure,
            exports: std::sync::OnceLock::new(),
        };
        let out = crate::output_within(
            stack.command().arg("up").args(services),
            Duration::from_secs(300),
        );
        assert!(
            out.status.success(),
            "private stack did not start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        stack
    }

    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(repo_root().join("scripts/stack"));
        cmd.env("STACK_DIR", &self.dir)
            .env("STACK_PORT_BASE", self.base.to_string())
            .env("STACK_CACHE", &self.cache)
            .env("STACK_SECURE", if self.secure { "1" } else { "0" })
            // The shape of this stack is its own, whatever the caller's shell exported.
            .env_remove("STACK_KAFKA_BROKERS")
            .env_remove("STACK_REDIS_CLUSTER")
            .env_remove("STACK_SERVICES");
        cmd
    }

    /// The `STOCKSVR__...` variables of this stack's servers (only the started ones are
    /// worth using).
    pub fn env(&self) -> Vec<(String, String)> {
        let out = crate::output_within(self.command().arg("env"), Duration::from_secs(30));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| k.starts_with("STOCKSVR__"))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect()
    }

    /// One variable of [`PrivateStack::env`].
    pub fn var(&self, key: &str) -> String {
        self.env()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("the private stack has no {key}"))
    }

    pub fn pid(&self, service: &str) -> u32 {
        let out = crate::output_within(
            self.command().args(["pid", service]),
            Duration::from_secs(30),
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{service} of the private stack is not running"))
    }

    /// Sends `signal` ("-STOP", "-CONT", "-KILL") to a server of this stack.
    pub fn signal(&self, service: &str, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid(service).to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {service}");
    }
}

impl PrivateStack {
    /// Starts `service` again after it died (kill -9): `scripts/stack up` restarts what is
    /// not running; Redis reloads its append-only file.
    pub fn restart(&self, service: &str) {
        let out = crate::output_within(
            self.command().args(["up", service]),
            Duration::from_secs(300),
        );
        assert!(
            out.status.success(),
            "private {service} did not restart: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Kills `service` with SIGKILL, deletes everything it stored, and starts it again empty
    /// (a Redis that lost its data: a flush, a failover to a replica that had nothing).
    pub fn restart_empty(&self, service: &str) {
        self.signal(service, "-KILL");
        let pidfile = self.dir.join("run").join(format!("{service}.pid"));
        // The pid file stays behind a killed process; wait for the process itself to go.
        let gone = crate::eventually_some_blocking(Duration::from_secs(30), || {
            let proc = format!("/proc/{}", self.pid_or_zero(service));
            (!std::path::Path::new(&proc).exists()).then_some(())
        });
        assert!(gone.is_some(), "{service} did not die");
        let _ = std::fs::remove_file(pidfile);
        let data = self.dir.join("data").join(service);
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("data dir");
        self.restart(service);
    }

    fn pid_or_zero(&self, service: &str) -> u32 {
        self.command()
            .args(["pid", service])
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for PrivateStack {
    fn drop(&mut self) {
        // A server left stopped would never exit on SIGTERM.
        for service in &self.services {
            if let Ok(out) = self.command().args(["pid", service]).output() {
                let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if !pid.is_empty() {
                    let _ = Command::new("kill").args(["-CONT", &pid]).status();
                }
            }
        }
        let _ = self.command().arg("down").output();
        if std::env::var("STOCKSVR_TEST_KEEP").as_deref() != Ok("1") {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The stack ports above the base: MariaDB, Redis, the registry (and its management port),
/// stocksvr, Prometheus, Kafka (client, controller, and the secure stack's inter-broker).
const OFFSETS: [u16; 9] = [7, 80, 81, 82, 88, 90, 92, 93, 95];

/// A port base whose stack ports are all free now: within `STOCKSVR_TEST_PORT_RANGE`
/// (`27000-27499`: the ports agreed for one user of a shared machine; stacks 100 apart, as
/// a private stack uses its base + 7 to + 95) when set, else from 20000 up to the kernel's
/// ephemeral ports. Never among those: a port free when it was picked could be taken by
/// any outgoing connection in the half minute before its server binds it (a secure
/// stack's registry, last to start, once found its management port so taken).
fn free_base() -> u16 {
    let free = |base: u16| {
        OFFSETS
            .iter()
            .all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok())
    };
    let (lo, hi) = match std::env::var("STOCKSVR_TEST_PORT_RANGE") {
        Ok(range) => range
            .split_once('-')
            .and_then(|(lo, hi)| {
                Some((
                    lo.trim().parse::<u16>().ok()?,
                    hi.trim().parse::<u16>().ok()?,
                ))
            })
            .filter(|(lo, hi)| hi.saturating_sub(*lo) >= 99)
            .unwrap_or_else(|| {
                panic!("STOCKSVR_TEST_PORT_RANGE={range}: expected LOW-HIGH, at least 100 ports")
            }),
        Err(_) => (20_000, ephemeral_low().saturating_sub(1)),
    };
    let (low, slots, step) = (lo, (hi.saturating_sub(lo) + 1) / 100, 100);
    assert!(slots > 0, "no room for a private stack in ports {lo}-{hi}");
    // Random order: tests starting stacks at once rarely try the same base first.
    let first = rand_u16() % slots;
    for k in 0..slots {
        let base = low + ((first + k) % slots) * step;
        if free(base) {
            return base;
        }
    }
    panic!("no free port range for a private stack");
}

/// The first of the ports the kernel hands to outgoing connections (Linux: 32768 unless
/// tuned).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

fn rand_u16() -> u16 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    crate::unique("port").hash(&mut h);
    (h.finish() % 65_536) as u16
}
